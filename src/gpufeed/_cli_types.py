"""Parameter types and options the command line shares."""

from __future__ import annotations

import click

from .config import parse_size

__all__ = ["SizeType", "CATALOG_OPTION", "CLUSTER_OPTION"]

#: ``--catalog URL``: where the node's catalog lives (``None``: env GPUFEED_CATALOG, else SQLite).
CATALOG_OPTION = click.option(
    "--catalog", "catalog_url", default=None, metavar="URL",
    help="Where the catalog lives: postgresql://user:password@host:port/dbname, or '' for SQLite in the data "
         "folder (the default; env GPUFEED_CATALOG). Prefer the env variable for a URL with a password.")
#: ``--cluster NAME``: the owner name a PostgreSQL catalog records.
CLUSTER_OPTION = click.option(
    "--cluster", default=None, metavar="NAME",
    help="PostgreSQL catalog: the cluster name recorded as its owner (default: the data folder's id; "
         "env GPUFEED_CLUSTER).")


class SizeType(click.ParamType):
    """A byte count: an integer or a size such as ``256MiB`` or ``1GiB``."""

    name = "size"

    def convert(self, value, param, ctx):
        try:
            size = value if isinstance(value, int) else parse_size(value)
        except ValueError:
            self.fail(f"{value!r} is not a size like 256MiB or 1GiB", param, ctx)
        if size < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        return size
