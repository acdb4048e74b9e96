"""ListObjectVersions through boto3 against a real node: order, elements,
prefixes, pagination by key and version-id markers, URL encoding, and buckets
that were never versioned.

Source: "ListObjectVersions", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectVersions.html
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def _entries(page: dict) -> list[tuple[str, str, bool, bool]]:
    """``(key, version id, is latest, is delete marker)`` of a page, in S3's order."""
    out = [(v["Key"], v["VersionId"], v["IsLatest"], False) for v in page.get("Versions", [])]
    out += [(m["Key"], m["VersionId"], m["IsLatest"], True) for m in page.get("DeleteMarkers", [])]
    # boto3 splits the two element kinds; S3 interleaves them by key, newest first
    return out


@pytest.fixture
def raw_node(node, raw_for):
    """Raw signed requests to the session node."""
    return raw_for(node.s3_url, node.access_key, node.secret_key)


def test_never_versioned_bucket_lists_null_versions(s3, bucket):
    """Every object of a bucket that was never versioned is its key's null version,
    latest, with its ETag, size, storage class and owner."""
    s3.put_object(Bucket=bucket, Key="a", Body=b"12345")
    s3.put_object(Bucket=bucket, Key="b/c", Body=b"")
    page = s3.list_object_versions(Bucket=bucket)
    assert page["IsTruncated"] is False and "DeleteMarkers" not in page
    versions = page["Versions"]
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in versions] == [("a", "null", True),
                                                                             ("b/c", "null", True)]
    head = s3.head_object(Bucket=bucket, Key="a")
    assert versions[0]["ETag"] == head["ETag"] and versions[0]["Size"] == 5
    assert versions[0]["StorageClass"] == "STANDARD" and versions[0]["Owner"]["ID"]
    assert versions[0]["LastModified"].replace(microsecond=0) == head["LastModified"]
    empty = s3.list_object_versions(Bucket=bucket, Prefix="zzz")
    assert "Versions" not in empty and empty["IsTruncated"] is False


def test_order_and_delete_markers_interleaved(s3, bucket, raw_node):
    """Versions and delete markers by key, newest first within a key, as one
    sequence (checked on the XML, since boto3 splits the two kinds)."""
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    a1 = s3.put_object(Bucket=bucket, Key="a", Body=b"1")["VersionId"]
    a_dm = s3.delete_object(Bucket=bucket, Key="a")["VersionId"]
    a2 = s3.put_object(Bucket=bucket, Key="a", Body=b"2")["VersionId"]
    b_dm = s3.delete_object(Bucket=bucket, Key="b")["VersionId"]  # a marker for a key that had none
    resp = raw_node.request("GET", f"/{bucket}?versions")
    assert resp.status == 200
    body = resp.body.decode()
    order = [body.index(f"<VersionId>{v}</VersionId>") for v in (a2, a_dm, a1, b_dm)]
    assert order == sorted(order)
    assert body.index("<DeleteMarker>") < body.index(f"<VersionId>{a_dm}")
    page = s3.list_object_versions(Bucket=bucket)
    assert sorted(_entries(page)) == sorted([("a", a2, True, False), ("a", a_dm, False, True),
                                             ("a", a1, False, False), ("b", b_dm, True, True)])
    assert all(m["Owner"]["ID"] for m in page["DeleteMarkers"])


def test_prefix_delimiter_and_common_prefixes(s3, bucket):
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for key in ("photos/2024/a.jpg", "photos/2024/b.jpg", "photos/2025/c.jpg", "photos/top.jpg", "docs/x"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"1")
        s3.put_object(Bucket=bucket, Key=key, Body=b"2")
    page = s3.list_object_versions(Bucket=bucket, Prefix="photos/", Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["photos/2024/", "photos/2025/"]
    assert [v["Key"] for v in page["Versions"]] == ["photos/top.jpg", "photos/top.jpg"]
    assert page["Prefix"] == "photos/" and page["Delimiter"] == "/"
    pages = list(s3.get_paginator("list_object_versions").paginate(
        Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 1}))
    prefixes = [p["Prefix"] for pg in pages for p in pg.get("CommonPrefixes", [])]
    assert prefixes == ["docs/", "photos/"] and not any(pg.get("Versions") for pg in pages)


def test_paginator_over_many_keys_and_versions(s3, bucket):
    """boto3's paginator (NextKeyMarker / NextVersionIdMarker) returns every version
    once, in order, for every page size."""
    s3.put_object(Bucket=bucket, Key="k00", Body=b"before versioning")  # a null version
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    expected: dict[str, list[tuple[str, bool]]] = {"k00": [("null", False)]}
    for i in range(12):
        key = f"k{i:02d}"
        for n in range(1 + i % 3):
            vid = s3.put_object(Bucket=bucket, Key=key, Body=f"{key}-{n}".encode())["VersionId"]
            expected.setdefault(key, []).insert(0, (vid, False))
        if i % 4 == 0:
            vid = s3.delete_object(Bucket=bucket, Key=key)["VersionId"]
            expected[key].insert(0, (vid, True))
    want = [(key, vid, n == 0, dm) for key in sorted(expected) for n, (vid, dm) in enumerate(expected[key])]
    assert len(want) == 28
    full = s3.list_object_versions(Bucket=bucket)
    assert full["IsTruncated"] is False and sorted(_entries(full)) == sorted(want)
    for size in (1, 2, 5, 7, 27, 28, 100):
        seen = []
        pages = list(s3.get_paginator("list_object_versions").paginate(
            Bucket=bucket, PaginationConfig={"PageSize": size}))
        for page in pages:
            entries = _entries(page)
            assert len(entries) <= size
            seen += sorted(entries, key=lambda e: want.index(e))
        assert seen == want, size
        assert all(pg["IsTruncated"] for pg in pages[:-1]) and not pages[-1]["IsTruncated"]


def test_key_and_version_id_markers(s3, bucket):
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    a = [s3.put_object(Bucket=bucket, Key="a", Body=b"x")["VersionId"] for _ in range(3)]
    b = s3.put_object(Bucket=bucket, Key="b", Body=b"x")["VersionId"]
    page = s3.list_object_versions(Bucket=bucket, MaxKeys=2)
    assert page["IsTruncated"] is True and page["MaxKeys"] == 2
    assert (page["NextKeyMarker"], page["NextVersionIdMarker"]) == ("a", a[1])
    rest = s3.list_object_versions(Bucket=bucket, KeyMarker="a", VersionIdMarker=a[1])
    assert [v["VersionId"] for v in rest["Versions"]] == [a[0], b]
    assert rest["KeyMarker"] == "a" and rest["VersionIdMarker"] == a[1]
    after_a = s3.list_object_versions(Bucket=bucket, KeyMarker="a")
    assert [v["VersionId"] for v in after_a["Versions"]] == [b]
    assert s3.list_object_versions(Bucket=bucket, MaxKeys=0).get("Versions") is None


def test_url_encoding_of_keys(s3, bucket, raw_node):
    """``encoding-type=url`` encodes keys, prefixes and markers as ListObjects does
    (space as ``+``); boto3 asks for it and decodes."""
    s3.put_object(Bucket=bucket, Key="a b+c/d", Body=b"x")
    page = s3.list_object_versions(Bucket=bucket, Prefix="a b")
    assert [v["Key"] for v in page["Versions"]] == ["a b+c/d"] and page["Prefix"] == "a b"
    resp = raw_node.request("GET", f"/{bucket}?versions&encoding-type=url&delimiter=%2F")
    assert b"<Prefix>a+b%2Bc/</Prefix>" in resp.body and b"<EncodingType>url</EncodingType>" in resp.body
    resp = raw_node.request("GET", f"/{bucket}?versions")
    assert b"<Key>a b+c/d</Key>" in resp.body


def test_bad_listing_parameters(s3, bucket, raw_node):
    """Source: "ListObjectVersions" (a version-id marker needs a key marker),
    Amazon S3 API Reference."""
    with pytest.raises(ClientError) as ei:
        s3.list_object_versions(Bucket=bucket, VersionIdMarker="null")
    assert _err(ei.value) == (400, "InvalidArgument")
    with pytest.raises(ClientError) as ei:
        s3.list_object_versions(Bucket=bucket, KeyMarker="a", VersionIdMarker="not-an-id")
    assert _err(ei.value) == (400, "InvalidArgument")
    for query in ("max-keys=-1", "max-keys=x", "encoding-type=base64"):
        resp = raw_node.request("GET", f"/{bucket}?versions&{query}")
        assert resp.status == 400 and b"<Code>InvalidArgument</Code>" in resp.body, query
    with pytest.raises(ClientError) as ei:
        s3.list_object_versions(Bucket=bucket + "-missing")
    assert _err(ei.value) == (404, "NoSuchBucket")
    for method in ("DELETE", "POST", "PUT"):
        resp = raw_node.request(method, f"/{bucket}?versions")
        assert resp.status == 405, method
    assert s3.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
