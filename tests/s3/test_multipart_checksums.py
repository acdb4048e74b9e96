"""Multipart uploads created with a checksum algorithm: every part carries that
algorithm's checksum, CompleteMultipartUpload checks the part checksums it
lists, and ListParts / ListMultipartUploads report them. Each test names the
AWS API page it follows; refusals change nothing."""

from __future__ import annotations

import base64
import os
import uuid
import xml.etree.ElementTree as ET
import zlib

import pytest
from botocore.exceptions import ClientError

from gpufeed.checksums import composite_checksum, new_hasher

MiB = 1 << 20
_PART = 5 * MiB


def _err(exc: ClientError) -> tuple[int, str, str]:
    r = exc.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"], r["Error"]["Message"]


def _b64(algorithm: str, data: bytes) -> str:
    h = new_hasher(algorithm.lower())
    h.update(data)
    return base64.b64encode(h.digest()).decode()


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _key() -> str:
    return f"mpc-{uuid.uuid4().hex[:8]}"


def _create(c, bkt: str, key: str, algorithm: str, ctype: str | None = None) -> str:
    kw = {"ChecksumType": ctype} if ctype else {}
    return c.create_multipart_upload(Bucket=bkt, Key=key, ChecksumAlgorithm=algorithm, **kw)["UploadId"]


@pytest.fixture
def plain(s3_node):
    """A boto3 client that sends a checksum only when told to (no CRC32 by default)."""
    c = s3_node.client(request_checksum_calculation="when_required")
    yield c
    c.close()


# UploadPart -------------------------------------------------------------------------
@pytest.mark.parametrize("ctype", ["COMPOSITE", "FULL_OBJECT"])
@pytest.mark.parametrize("other", ["CRC32C", "SHA256"])
def test_upload_part_with_another_algorithm_is_refused(s3c, plain, bkt, ctype, other):
    """A part of an upload created with CRC32 that carries another algorithm's
    checksum is 400 InvalidRequest, as S3 words it; nothing is stored.

    Source: "UploadPart" (InvalidRequest: "Checksum Type mismatch occurred,
    expected checksum Type: sha1, actual checksum Type: crc32c"), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPart.html"""
    if other == "SHA256" and ctype == "FULL_OBJECT":
        other = "CRC64NVME"
    key = _key()
    uid = _create(s3c, bkt, key, "CRC32", ctype)
    body = os.urandom(1000)
    for kwargs in ({"ChecksumAlgorithm": other}, {f"Checksum{other}": _b64(other, body)}):
        with pytest.raises(ClientError) as ei:
            plain.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=body, **kwargs)
        assert _err(ei.value) == (400, "InvalidRequest", "Checksum Type mismatch occurred, expected checksum "
                                  f"Type: crc32, actual checksum Type: {other.lower()}")
    assert s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid).get("Parts", []) == []
    r = s3c.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=body, ChecksumAlgorithm="CRC32")
    assert r["ChecksumCRC32"] == _crc32(body)
    s3c.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=uid)


def test_upload_part_without_checksum_composite_is_refused(s3c, plain, bkt):
    """A COMPOSITE upload's part sent without a checksum is 400 InvalidRequest
    ("... actual checksum Type: null"); nothing is stored.

    Source: "UploadPart" (InvalidRequest, checksum type mismatch), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPart.html"""
    key = _key()
    uid = _create(s3c, bkt, key, "SHA1")
    with pytest.raises(ClientError) as ei:
        plain.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=b"no checksum")
    assert _err(ei.value) == (400, "InvalidRequest", "Checksum Type mismatch occurred, expected checksum "
                              "Type: sha1, actual checksum Type: null")
    assert s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid).get("Parts", []) == []
    s3c.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=uid)


def test_upload_part_without_checksum_full_object_is_computed(s3c, plain, bkt):
    """A FULL_OBJECT upload's part sent without a checksum is accepted and the
    server computes the upload's algorithm over it (as S3 does), so the upload
    completes with the whole object's CRC.

    Source: "Checking object integrity in Amazon S3" (full object checksums for
    multipart uploads), Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html"""
    key = _key()
    uid = _create(s3c, bkt, key, "CRC32", "FULL_OBJECT")
    datas = [os.urandom(_PART), b"tail"]
    parts = []
    for n, data in enumerate(datas, 1):
        r = plain.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=n, Body=data)
        assert r["ChecksumCRC32"] == _crc32(data)
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    listed = s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid)["Parts"]
    assert [p["ChecksumCRC32"] for p in listed] == [_crc32(d) for d in datas]
    done = s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
    assert done["ChecksumCRC32"] == _crc32(b"".join(datas)) and done["ChecksumType"] == "FULL_OBJECT"


def test_sdk_checksum_algorithm_must_name_the_checksum_sent(raw, s3c, bkt, code_of):
    """``x-amz-sdk-checksum-algorithm`` naming another algorithm than the checksum
    sent is 400 InvalidRequest "Value for x-amz-sdk-checksum-algorithm header is
    invalid." (UploadPart and PutObject alike).

    Source: "UploadPart" / "PutObject" (``x-amz-sdk-checksum-algorithm``), Amazon S3
    API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPart.html"""
    key = _key()
    uid = _create(s3c, bkt, key, "CRC32")
    body = b"part body"
    headers = {"x-amz-sdk-checksum-algorithm": "CRC32C", "x-amz-checksum-crc32": _crc32(body)}
    for path in (f"/{bkt}/{key}?partNumber=1&uploadId={uid}", f"/{bkt}/{key}"):
        r = raw.request("PUT", path, body=body, headers=headers)
        assert r.status == 400 and code_of(r.body) == "InvalidRequest"
        assert ET.fromstring(r.body).findtext("Message") == \
            "Value for x-amz-sdk-checksum-algorithm header is invalid."
    assert s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid).get("Parts", []) == []
    r = raw.request("PUT", f"/{bkt}/{key}?partNumber=1&uploadId={uid}", body=body,
                    headers={"x-amz-sdk-checksum-algorithm": "CRC32", "x-amz-checksum-crc32": _crc32(body)})
    assert r.status == 200 and r.headers["x-amz-checksum-crc32"] == _crc32(body)
    s3c.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=uid)


def test_upload_part_non_canonical_base64_is_invalid(s3c, bkt):
    """A checksum whose base64 has padding bits set (``y/Q5Jh==`` for ``y/Q5Jg==``)
    is 400 InvalidRequest "Value for x-amz-checksum-crc32 header is invalid.".

    Source: "UploadPart" (``x-amz-checksum-crc32``: base64-encoded), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPart.html"""
    key = _key()
    uid = _create(s3c, bkt, key, "CRC32")
    body = b"abc"
    good = _crc32(body)
    bits = base64.b64decode(good)
    bad = base64.b64encode(bits).decode()[:5] + chr(ord(good[5]) + 1) + "=="
    assert base64.b64decode(bad) == bits and bad != good
    with pytest.raises(ClientError) as ei:
        s3c.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=body, ChecksumCRC32=bad)
    assert _err(ei.value) == (400, "InvalidRequest", "Value for x-amz-checksum-crc32 header is invalid.")
    s3c.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=uid)


# UploadPartCopy -----------------------------------------------------------------------
def test_upload_part_copy_carries_the_upload_algorithm(s3c, bkt):
    """UploadPartCopy into an upload created with an algorithm returns the part's
    checksum in CopyPartResult; the upload then completes with it.

    Source: "UploadPartCopy" (CopyPartResult ``ChecksumSHA256`` ...), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPartCopy.html"""
    src = os.urandom(_PART + 100)
    s3c.put_object(Bucket=bkt, Key="mpc-src", Body=src)
    key = _key()
    uid = _create(s3c, bkt, key, "SHA256")
    r = s3c.upload_part_copy(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": bkt, "Key": "mpc-src"}, CopySourceRange=f"bytes=0-{_PART - 1}")
    one = r["CopyPartResult"]["ChecksumSHA256"]
    assert one == _b64("sha256", src[:_PART])
    two = s3c.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=2, Body=b"end", ChecksumAlgorithm="SHA256")
    parts = [{"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"], "ChecksumSHA256": one},
             {"PartNumber": 2, "ETag": two["ETag"], "ChecksumSHA256": two["ChecksumSHA256"]}]
    done = s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
    assert done["ChecksumSHA256"] == composite_checksum("sha256", [one, two["ChecksumSHA256"]])


# CompleteMultipartUpload ------------------------------------------------------------------
def _one_part_upload(c, bkt: str, algorithm: str, ctype: str | None = None):
    key = _key()
    uid = _create(c, bkt, key, algorithm, ctype)
    body = os.urandom(2048)
    r = c.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=body, ChecksumAlgorithm=algorithm)
    return key, uid, body, {"PartNumber": 1, "ETag": r["ETag"], f"Checksum{algorithm}": r[f"Checksum{algorithm}"]}


def test_complete_composite_needs_each_part_checksum(s3c, bkt):
    """Completing a COMPOSITE upload without a listed part's checksum is 400
    InvalidRequest, worded as S3 words it; the upload stays open.

    Source: "CompleteMultipartUpload" (``ChecksumCRC32`` ... of each part), Amazon S3
    API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    key, uid, _body, part = _one_part_upload(s3c, bkt, "CRC32C")
    bare = {"PartNumber": 1, "ETag": part["ETag"]}
    with pytest.raises(ClientError) as ei:
        s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [bare]})
    assert _err(ei.value) == (400, "InvalidRequest", "The upload was created using a crc32c checksum. The "
                              "complete request must include the checksum for each part. It was missing for "
                              "part 1 in the request.")
    assert len(s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid)["Parts"]) == 1
    done = s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [part]})
    assert done["ChecksumCRC32C"].endswith("-1")


def test_complete_full_object_part_checksums_are_optional(s3c, bkt):
    """A FULL_OBJECT upload completes without the part checksums listed (S3
    combines the stored ones).

    Source: "CompleteMultipartUpload", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    key, uid, body, part = _one_part_upload(s3c, bkt, "CRC32", "FULL_OBJECT")
    bare = {"PartNumber": 1, "ETag": part["ETag"]}
    done = s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [bare]})
    assert done["ChecksumCRC32"] == _crc32(body) and done["ChecksumType"] == "FULL_OBJECT"


@pytest.mark.parametrize("ctype", ["COMPOSITE", "FULL_OBJECT"])
def test_complete_part_checksum_not_the_stored_one_is_invalid_part(s3c, bkt, ctype):
    """A listed part checksum that differs from the part's is 400 InvalidPart with
    S3's message; with a whole-object checksum too, a COMPOSITE upload answers
    BadDigest ("The crc32 you specified did not match the calculated checksum."),
    a FULL_OBJECT one InvalidPart. The upload stays open.

    Source: "CompleteMultipartUpload" (InvalidPart, BadDigest), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    key, uid, body, part = _one_part_upload(s3c, bkt, "CRC32", ctype)
    wrong = {**part, "ChecksumCRC32": _crc32(body + b"x")}
    invalid_part = (400, "InvalidPart", "One or more of the specified parts could not be found.  The part may "
                    "not have been uploaded, or the specified entity tag may not match the part's entity tag.")
    with pytest.raises(ClientError) as ei:
        s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [wrong]})
    assert _err(ei.value) == invalid_part
    whole = _crc32(body) if ctype == "FULL_OBJECT" else composite_checksum("crc32", [part["ChecksumCRC32"]])
    with pytest.raises(ClientError) as ei:
        s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [wrong]},
                                      ChecksumCRC32=whole)
    if ctype == "COMPOSITE":
        assert _err(ei.value) == (400, "BadDigest", "The crc32 you specified did not match the calculated checksum.")
    else:
        assert _err(ei.value) == invalid_part
    assert len(s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid)["Parts"]) == 1
    done = s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [part]},
                                         ChecksumCRC32=whole)
    assert done["ChecksumCRC32"].split("-")[0] == whole.split("-")[0]


def test_complete_malformed_part_checksum_is_invalid_argument(s3c, bkt):
    """A listed part checksum that is not base64 of the algorithm's digest (or two
    checksums for one part) is 400 InvalidArgument "Invalid Base64 or multiple
    checksums present in request", naming the argument as S3 does.

    Source: "CompleteMultipartUpload", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    key, uid, _body, part = _one_part_upload(s3c, bkt, "CRC32")
    for bad in ({**part, "ChecksumCRC32": "AAAA"}, {**part, "ChecksumSHA1": _b64("sha1", b"x")}):
        with pytest.raises(ClientError) as ei:
            s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [bad]})
        assert _err(ei.value) == (400, "InvalidArgument", "Invalid Base64 or multiple checksums present in request")
        assert ei.value.response["Error"]["ArgumentName"] == "Checksum"
    assert ei.value.response["Error"]["ArgumentValue"] == \
        f"CRC32:{part['ChecksumCRC32']};SHA1:{_b64('sha1', b'x')};"
    s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": [part]})


# ListParts and ListMultipartUploads ----------------------------------------------------------
@pytest.mark.parametrize(("algorithm", "ctype"), [
    ("CRC32", "COMPOSITE"), ("CRC32C", "FULL_OBJECT"), ("CRC64NVME", "FULL_OBJECT"),
    ("SHA1", "COMPOSITE"), ("SHA256", "COMPOSITE"),
])
def test_list_parts_reports_checksums(s3c, bkt, algorithm, ctype):
    """ListParts gives each part's checksum and the upload's ChecksumAlgorithm and
    ChecksumType; ListMultipartUploads gives each upload's algorithm and type.

    Source: "ListParts" (``Part/ChecksumCRC32`` ..., ``ChecksumAlgorithm``,
    ``ChecksumType``), https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListParts.html,
    and "ListMultipartUploads" (``Upload/ChecksumAlgorithm``, ``Upload/ChecksumType``),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListMultipartUploads.html, Amazon S3 API Reference"""
    key = _key()
    uid = _create(s3c, bkt, key, algorithm, ctype)
    datas = [b"first part", b"second part"]
    for n, data in enumerate(datas, 1):
        s3c.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=n, Body=data, ChecksumAlgorithm=algorithm)
    listed = s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid)
    assert listed["ChecksumAlgorithm"] == algorithm and listed["ChecksumType"] == ctype
    assert [p[f"Checksum{algorithm}"] for p in listed["Parts"]] == [_b64(algorithm, d) for d in datas]
    page = s3c.list_parts(Bucket=bkt, Key=key, UploadId=uid, MaxParts=1, PartNumberMarker=1)
    assert [p[f"Checksum{algorithm}"] for p in page["Parts"]] == [_b64(algorithm, datas[1])]
    uploads = [u for u in s3c.list_multipart_uploads(Bucket=bkt, Prefix=key)["Uploads"] if u["UploadId"] == uid]
    assert [(u["ChecksumAlgorithm"], u["ChecksumType"]) for u in uploads] == [(algorithm, ctype)]
    s3c.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=uid)


def test_list_parts_of_an_upload_without_algorithm(plain, bkt):
    """An upload created without a checksum algorithm lists none."""
    key = _key()
    uid = plain.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    plain.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=b"x")
    listed = plain.list_parts(Bucket=bkt, Key=key, UploadId=uid)
    assert "ChecksumAlgorithm" not in listed and "ChecksumType" not in listed
    assert not any(k.startswith("Checksum") for k in listed["Parts"][0])
    uploads = plain.list_multipart_uploads(Bucket=bkt, Prefix=key)["Uploads"]
    assert "ChecksumAlgorithm" not in uploads[0]
    plain.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=uid)
