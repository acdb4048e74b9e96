"""Parameter types the command line shares."""

from __future__ import annotations

import click

from .config import parse_size

__all__ = ["SizeType"]


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
