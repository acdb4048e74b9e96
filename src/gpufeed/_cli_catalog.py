"""``gpufeed catalog check|recover``: the integrity of a node's catalog, and its recovery."""

from __future__ import annotations

import json
import sys

import click

from ._cli_types import CATALOG_OPTION

__all__ = ["catalog"]

DATA_DIR_OPTION = click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                               help="The node's data folder (default $GPUFEED_DATA_DIR or ~/.local/share/gpufeed).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")


def _data_dir(data_dir: str | None) -> str:
    from .config import default_data_dir

    return str(data_dir or default_data_dir())


def _require_sqlite(folder: str, catalog_url: str | None, command: str) -> None:
    """Refuse a node whose catalog is in PostgreSQL: check and recover read SQLite files.

    Raises:
        InvalidArgument: ``--catalog`` / ``GPUFEED_CATALOG`` names a PostgreSQL
            catalog, or the folder says its catalog is in one.
    """
    from pathlib import Path

    from .config import NodeConfig
    from .engine._catalogs import POSTGRES_MARKER, is_postgres
    from .errors import InvalidArgument

    marker = Path(folder) / POSTGRES_MARKER
    url = NodeConfig.from_env(catalog=catalog_url).catalog
    if is_postgres(url) or marker.is_file():
        where = marker.read_text().strip() if marker.is_file() else "the database --catalog names"
        raise InvalidArgument(
            f"gpufeed catalog {command} works on SQLite catalogs (catalog.sqlite3), not on PostgreSQL ones: this "
            f"node's catalog is in PostgreSQL ({where}). Check and protect it with PostgreSQL's own tools "
            "(pg_amcheck, pg_dump / pg_restore, the server's backups and replicas)")


@click.group()
def catalog() -> None:
    """The node's SQLite catalog (the metadata of every bucket and object): check it, recover it.

    A catalog in PostgreSQL is checked and backed up with PostgreSQL's own tools."""


@catalog.command("check")
@DATA_DIR_OPTION
@click.option("--level", type=click.Choice(["quick", "full"]), default="full", show_default=True,
              help="quick: PRAGMA quick_check; full: PRAGMA integrity_check (indexes against tables too).")
@CATALOG_OPTION
@JSON_OPTION
def catalog_check(data_dir, level, catalog_url, as_json) -> None:
    """Check the SQLite catalog without changing it (a node may be running); exit 1 if it is damaged."""
    from .engine import check_data_dir
    from .engine._catalogcheck import recover_hint

    folder = _data_dir(data_dir)
    _require_sqlite(folder, catalog_url, "check")
    report = check_data_dir(folder, level)
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    elif report.ok:
        click.echo(f"catalog {report.path}: ok ({level} check, schema version {report.schema_version}, "
                   f"{report.seconds:.2f} s)")
    else:
        click.echo(f"catalog {report.path}: DAMAGED ({level} check, {len(report.problems)} problems)")
        for p in report.problems:
            click.echo(f"  {p}")
        if not report.too_new:
            click.echo(recover_hint(folder))
    if not report.ok:
        sys.exit(1)


def _show_recovery(r) -> str:
    if not r.recovered:
        return f"catalog {r.before.path}: ok; nothing recovered (--force rebuilds it anyway)"
    lines = [f"catalog {r.before.path}: " + ("; ".join(r.before.problems[:3]) or "rebuilt on request")]
    lines += [f"kept the damaged file: {k}" for k in r.kept]
    if r.header_rebuilt:
        lines.append("its header was overwritten: rebuilt in the copy read")
    if r.schema_error:
        lines.append(f"its table list could not be read ({r.schema_error}): nothing could be saved")
    lines.append(f"{'table':<20} {'saved':>10} {'lost':>10}")
    for t in r.tables:
        if t.rows or t.damaged:
            lost = "unknown" if t.damaged and t.lost is None else str(t.lost or 0)
            lines.append(f"{t.table:<20} {t.rows:>10} {lost:>10}" + ("  (damaged)" if t.damaged else ""))
    if r.buckets_recreated:
        lines.append(f"buckets recreated with default settings (owner: the default tenant): "
                     f"{', '.join(r.buckets_recreated)}")
    lines += [f"{what}: {n}" for what, n in r.fixes.items()]
    moved = ", ".join(f"{n} {k}" for k, n in r.moved.items() if n)
    lines.append(f"data files no saved row names: {moved or 'none'}"
                 + (f", moved to {r.lost_found} (kept, not deleted)" if r.lost_found else ""))
    if r.missing_files:
        lines.append(f"data files the saved rows name that are missing: {r.missing_files}")
    ok = r.after is not None and r.after.ok
    lines.append("the new catalog passes the full check; the node can start" if ok
                 else f"the new catalog FAILS its check: {r.after.problems if r.after else '?'}")
    return "\n".join(lines)


@catalog.command("recover")
@DATA_DIR_OPTION
@click.option("--force", is_flag=True, help="Rebuild even a catalog that passes its check.")
@CATALOG_OPTION
@JSON_OPTION
def catalog_recover(data_dir, force, catalog_url, as_json) -> None:
    """Rebuild a damaged catalog from every row it still holds (the node must be stopped).

    The damaged file is kept beside it, renamed with the time; data files no saved
    row names are moved to lost+found/ in the data folder. Exit 1 if the rebuilt
    catalog does not pass its check, or if nothing at all could be read (the
    node would start empty; every data file is then in lost+found/).
    """
    from .engine import recover_catalog

    _require_sqlite(_data_dir(data_dir), catalog_url, "recover")
    report = recover_catalog(_data_dir(data_dir), force=force)
    click.echo(json.dumps(report.as_dict()) if as_json else _show_recovery(report))
    if report.recovered and not (report.after is not None and report.after.ok):
        sys.exit(1)
    if report.schema_error is not None:  # a fresh, empty catalog: say so loudly, and fail
        click.echo(f"error: nothing could be read from the damaged catalog ({report.schema_error}); the node "
                   f"would start empty. Every data file is kept in {report.lost_found or 'lost+found/'} and the "
                   f"damaged catalog as {', '.join(report.kept) or '(none)'}; a page-level reader may still save "
                   "rows from it: sqlite3 DAMAGED .recover | sqlite3 recovered.sqlite3", err=True)
        sys.exit(1)
