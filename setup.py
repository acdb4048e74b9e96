"""The one C extension (everything else is in pyproject.toml): the fast path's
batch read loop, gpufeed._native.ranges. Optional: without a C compiler the
install goes on and the same reads run in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gpufeed._native.ranges", ["src/gpufeed/_native/ranges.c"], optional=True)])
