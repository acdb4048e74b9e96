"""The public surface of gpufeed.s3 (the node runner's contract)."""

from __future__ import annotations

import importlib
import inspect

import pytest

import gpufeed.s3 as s3


def test_public_names_complete():
    assert {"make_app", "start_s3"} <= set(s3.__all__)
    for name in s3.__all__:
        assert getattr(s3, name) is not None
    assert inspect.iscoroutinefunction(s3.start_s3)
    assert list(inspect.signature(s3.make_app).parameters) == ["engine", "config"]
    assert list(inspect.signature(s3.start_s3).parameters) == ["engine", "config"]


@pytest.mark.parametrize("module", ["_app", "_router", "_context", "_headers", "_objects", "_listing",
                                    "_multipart", "_buckets", "_auth", "_body", "_checksum", "_xml"])
def test_module_names_resolve(module):
    mod = importlib.import_module(f"gpufeed.s3.{module}")
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def test_not_modified_carries_validators(raw, s3_node):
    s3_node.engine.create_bucket("nm-bucket")
    info = s3_node.engine.put_object("nm-bucket", "k", b"v")
    r = raw.request("GET", "/nm-bucket/k", headers={"If-None-Match": f'"{info.etag}"'})
    assert r.status == 304 and r.body == b""
    assert r.headers["ETag"] == f'"{info.etag}"' and r.headers["x-amz-request-id"]
