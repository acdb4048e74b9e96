"""The public names are complete and importable (httpx-style check)."""

import gpufeed
import gpufeed.ai
import gpufeed.client
import gpufeed.engine
import gpufeed.errors


def test_public_names_resolve():
    for mod in (gpufeed, gpufeed.ai, gpufeed.client, gpufeed.engine, gpufeed.errors):
        for name in mod.__all__:
            assert getattr(mod, name) is not None, f"{mod.__name__}.{name}"


def test_every_error_is_exported_and_mapped():
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
