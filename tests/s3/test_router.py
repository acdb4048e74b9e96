"""The S3 router as a pure function: request line + headers -> Target -> Endpoint."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from gpufeed.errors import InvalidArgument, MethodNotAllowed, NotImplementedByGpufeed
from gpufeed.s3 import _router as r
from gpufeed.s3._app import HANDLERS


def endpoint(method: str, target: str, **headers: str) -> r.Endpoint:
    """Route one request; ``headers`` use ``_`` for ``-`` (``x_amz_copy_source=...``)."""
    h = CIMultiDict({k.replace("_", "-"): v for k, v in headers.items()})
    h.setdefault("Host", "127.0.0.1:9000")
    return r.route(r.parse_target(method, target, h))


def test_target_path_style_and_virtual_host():
    t = r.parse_target("GET", "/b/dir/a%20b?list-type=2&prefix=x%2Fy&acl",
                       CIMultiDict({"Host": "127.0.0.1:9000"}))
    assert (t.bucket, t.key, t.virtual_bucket) == ("b", "dir/a b", None)
    assert (t.raw_path, t.raw_query, t.path) == ("/b/dir/a%20b", "list-type=2&prefix=x%2Fy&acl", "/b/dir/a b")
    assert t.query == {"list-type": "2", "prefix": "x/y", "acl": ""}
    v = r.parse_target("PUT", "/dir/k", CIMultiDict({"host": "Photos.s3.example.com",
                                                     "X-Amz-Copy-Source": "/src/key"}))
    assert (v.bucket, v.key, v.virtual_bucket, v.copy_source) == ("photos", "dir/k", "photos", "/src/key")
    assert r.parse_target("GET", "/", CIMultiDict({"Host": "b.localhost:1"})).key is None
    absolute = r.parse_target("GET", "http://127.0.0.1:9000/b/k?x=1", CIMultiDict())
    assert (absolute.bucket, absolute.key, absolute.raw_query, absolute.host) == ("b", "k", "x=1", None)


def test_first_of_repeated_query_names_wins():
    assert r.parse_target("GET", "/b?prefix=a&prefix=b", CIMultiDict()).query == {"prefix": "a"}


@pytest.mark.parametrize(("method", "target", "expected"), [
    ("GET", "/", r.ListBuckets()),
    ("HEAD", "/", r.ListBuckets()),
    ("GET", "/b", r.ListObjects("b", v2=False)),
    ("GET", "/b?list-type=2&prefix=p", r.ListObjects("b", v2=True)),
    ("GET", "/b?location", r.GetBucketLocation("b")),
    ("GET", "/b?versioning", r.GetBucketVersioning("b")),
    ("PUT", "/b?versioning", r.PutBucketVersioning("b")),
    ("GET", "/b?versions", r.ListObjectVersions("b")),
    ("GET", "/b?versions&prefix=p&key-marker=k", r.ListObjectVersions("b")),
    ("GET", "/b?acl", r.GetBucketAcl("b")),
    ("GET", "/b?uploads", r.ListMultipartUploads("b")),
    ("PUT", "/b?acl", r.PutBucketAcl("b")),
    ("GET", "/b?policy", r.GetBucketConfiguration("b", "policy")),
    ("PUT", "/b?policy", r.PutBucketPolicy("b")),
    ("DELETE", "/b?policy", r.DeleteBucketConfiguration("b", "policy")),
    ("GET", "/b?encryption", r.GetBucketConfiguration("b", "encryption")),
    ("DELETE", "/b?cors", r.DeleteBucketConfiguration("b", "cors")),
    ("GET", "/b?cors", r.GetBucketConfiguration("b", "cors")),
    ("PUT", "/b?cors", r.PutBucketCors("b")),
    ("GET", "/b?tagging", r.GetBucketConfiguration("b", "tagging")),
    ("PUT", "/b?tagging", r.PutBucketTagging("b")),
    ("DELETE", "/b?tagging", r.DeleteBucketConfiguration("b", "tagging")),
    ("OPTIONS", "/b/k?uploads", r.CorsPreflight("b", "k")),
    ("OPTIONS", "/b", r.CorsPreflight("b", None)),
    ("OPTIONS", "/", r.CorsPreflight(None, None)),
    ("PUT", "/b/k?acl", r.PutObjectAcl("b", "k")),
    ("GET", "/b/k?attributes", r.GetObjectAttributes("b", "k")),
    ("HEAD", "/b?acl", r.HeadBucket("b")),
    ("PUT", "/b", r.CreateBucket("b")),
    ("PUT", "/b?x-id=CreateBucket", r.CreateBucket("b")),
    ("DELETE", "/b/", r.DeleteBucket("b")),
    ("POST", "/b?delete", r.DeleteObjects("b")),
    ("POST", "/b", r.PostObject("b")),
    ("GET", "/b/k", r.GetObject("b", "k")),
    ("HEAD", "/b/k", r.HeadObject("b", "k")),
    ("GET", "/b/k?acl", r.GetObjectAcl("b", "k")),
    ("HEAD", "/b/k?acl", r.GetObjectAcl("b", "k")),
    ("HEAD", "/b/k?uploadId=u", r.HeadObject("b", "k")),
    ("GET", "/b/k?uploadId=u", r.ListParts("b", "k", "u")),
    ("PUT", "/b/a/b%2Fc", r.PutObject("b", "a/b/c")),
    ("PUT", "/b/k?uploadId=u&partNumber=7", r.UploadPart("b", "k", "u", 7)),
    ("DELETE", "/b/k", r.DeleteObject("b", "k")),
    ("DELETE", "/b/k?uploadId=u", r.AbortMultipartUpload("b", "k", "u")),
    ("POST", "/b/k?uploads", r.CreateMultipartUpload("b", "k")),
    ("POST", "/b/k?uploadId=u", r.CompleteMultipartUpload("b", "k", "u")),
])
def test_route(method, target, expected):
    ep = endpoint(method, target)
    assert ep == expected and type(ep) is type(expected)


def test_copy_source_routes_to_copies():
    assert endpoint("PUT", "/b/k", x_amz_copy_source="/src/a%20b?versionId=3") == \
        r.CopyObject("b", "k", "src", "a b", "3")
    assert endpoint("PUT", "/b/k", x_amz_copy_source="/src/a%20b") == r.CopyObject("b", "k", "src", "a b")
    assert endpoint("PUT", "/b/k?uploadId=u&partNumber=2", x_amz_copy_source="src/d/k") == \
        r.UploadPartCopy("b", "k", "u", 2, "src", "d/k")
    assert endpoint("PUT", "/b/k?uploadId=u&partNumber=2", x_amz_copy_source="src/d/k?versionId=null") == \
        r.UploadPartCopy("b", "k", "u", 2, "src", "d/k", "null")
    with pytest.raises(InvalidArgument):
        endpoint("PUT", "/b/k", x_amz_copy_source="/src/k?versionId=")


def test_virtual_host_routes_like_path_style():
    assert endpoint("GET", "/?list-type=2", Host="b.localhost:9000") == r.ListObjects("b", v2=True)
    assert endpoint("GET", "/k", Host="b.localhost:9000") == r.GetObject("b", "k")


@pytest.mark.parametrize(("method", "target", "headers", "error", "message"), [
    ("PUT", "/", {}, MethodNotAllowed, "not allowed"),
    ("PATCH", "/b", {}, MethodNotAllowed, "not allowed"),
    ("POST", "/b?foo", {}, MethodNotAllowed, "not allowed"),
    ("DELETE", "/b?versions", {}, MethodNotAllowed, "not allowed"),
    ("DELETE", "/b?versioning", {}, MethodNotAllowed, "not allowed"),
    ("PUT", "/b?versions", {}, MethodNotAllowed, "not allowed"),
    ("PATCH", "/b/k", {}, MethodNotAllowed, "not allowed"),
    ("GET", "/b?logging&cors", {}, NotImplementedByGpufeed, "'cors'"),
    ("GET", "/b?policy&cors", {}, NotImplementedByGpufeed, "'cors'"),
    ("DELETE", "/b?acl&cors", {}, NotImplementedByGpufeed, "'cors'"),
    ("PUT", "/b?logging", {}, NotImplementedByGpufeed, "'logging'"),
    ("PUT", "/b?policy&cors", {}, NotImplementedByGpufeed, "'cors'"),
    ("PUT", "/b?website", {}, NotImplementedByGpufeed, "'website'"),
    ("PUT", "/b?tagging&cors", {}, NotImplementedByGpufeed, "'cors'"),
    ("POST", "/b?cors", {}, NotImplementedByGpufeed, "'cors'"),
    ("PUT", "/b?foo", {}, NotImplementedByGpufeed, "PUT bucket ?foo"),
    ("GET", "/b/k?torrent", {}, NotImplementedByGpufeed, "'torrent'"),
    ("POST", "/b/k", {}, NotImplementedByGpufeed, "POST operation"),
    ("PUT", "/b/k?partNumber=1", {}, InvalidArgument, "uploadId is required"),
    ("PUT", "/b/k?uploadId=u&partNumber=0", {}, InvalidArgument, "between 1 and 10000"),
    ("PUT", "/b/k?uploadId=u&partNumber=x", {}, InvalidArgument, "between 1 and 10000"),
    ("PUT", "/b/k", {"x_amz_copy_source": "/only-bucket"}, InvalidArgument, "Copy Source"),
])
def test_route_refusals(method, target, headers, error, message):
    with pytest.raises(error, match=message.replace("?", r"\?")):
        endpoint(method, target, **headers)


def test_every_endpoint_has_one_handler():
    concrete = {cls for cls in vars(r).values()
                if isinstance(cls, type) and issubclass(cls, r.Endpoint)
                and cls not in (r.Endpoint, r.BucketEndpoint, r.ObjectEndpoint)}
    assert concrete == set(HANDLERS)
