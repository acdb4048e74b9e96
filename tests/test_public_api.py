"""The public names are complete and importable (httpx-style check), over every
public module of the package."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys
import types

import pytest

import gpufeed


def _public_modules() -> list[str]:
    names = ["gpufeed"]
    for m in pkgutil.walk_packages(gpufeed.__path__, "gpufeed."):
        if not any(part.startswith("_") for part in m.name.split(".")[1:]):
            names.append(m.name)
    return names


def _import(name: str) -> types.ModuleType:
    extra = os.environ.get("GPUFEED_LMCACHE_PATH")  # LMCache lives outside the venv (see Makefile)
    if extra and extra not in sys.path:
        sys.path.append(extra)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an optional integration's own dependency
        if exc.name and not exc.name.startswith("gpufeed"):
            pytest.skip(f"{name} needs {exc.name}")
        raise


@pytest.mark.parametrize("name", _public_modules())
def test_every_public_name_is_exported_and_every_export_resolves(name):
    mod = _import(name)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{name} declares no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    for n in exported:
        assert getattr(mod, n, None) is not None, f"{name}.{n} is exported but does not resolve"
    own = [n for n, obj in vars(mod).items()
           if not n.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
           and (obj.__module__ == name or obj.__module__.startswith(name + "._"))]
    missing = sorted(set(own) - set(exported))
    assert not missing, f"{name} defines public names it does not export: {missing}"


def test_every_error_is_exported_and_mapped():
    import gpufeed.errors
    from gpufeed.errors import S3_ERRORS, GpufeedError

    exported = [getattr(gpufeed.errors, n) for n in gpufeed.errors.__all__]
    stack = [GpufeedError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__ != "gpufeed.errors":
            continue  # errors of the AI modules live beside their code
        assert cls in exported, f"{cls.__name__} missing from errors.__all__"
        assert cls.code in S3_ERRORS
