"""Checksums end to end: every ``x-amz-checksum-*`` algorithm through boto3,
multipart FULL_OBJECT and COMPOSITE checksums, malformed and wrong values,
and the event loop staying responsive while an upload is hashed.

Sources: "Checking object integrity", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html;
"CreateMultipartUpload" and "CompleteMultipartUpload", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateMultipartUpload.html,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import statistics
import threading
import time
import zlib

import pytest
from botocore.exceptions import ClientError

from gpufeed.checksums import (
    combine_crc,
    composite_checksum,
    crc32c,
    crc64nvme,
    full_object_checksum,
    multipart_checksums,
    new_hasher,
)

awscrt = pytest.importorskip("awscrt.checksums")

_CRC = {"crc32": zlib.crc32, "crc32c": crc32c, "crc64nvme": crc64nvme}
_WIDTH = {"crc32": 4, "crc32c": 4, "crc64nvme": 8}
_PART = 5 << 20  # 5 MiB: the smallest part but the last


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _crc_b64(alg: str, data: bytes) -> str:
    return _b64(_CRC[alg](data).to_bytes(_WIDTH[alg], "big"))


def _digest_b64(alg: str, data: bytes) -> str:
    if alg in _CRC:
        return _crc_b64(alg, data)
    return _b64(hashlib.new(alg, data).digest())


def _code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


# -- the algorithms ------------------------------------------------------------------

def test_check_values():
    """The catalogue check values of each CRC ("123456789")."""
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283
    assert crc64nvme(b"123456789") == 0xAE8B14860A799888
    assert crc64nvme(b"6789", crc64nvme(b"12345")) == 0xAE8B14860A799888


@pytest.mark.parametrize("size", [0, 1, 15, 4096, (1 << 20) + 3])
def test_crc32_in_use_matches_zlib(size):
    """The CRC-32 the node computes (ISA-L's when ``isal`` is installed) is zlib's,
    whole and continued across pieces of any buffer type."""
    data = os.urandom(size)
    crc = new_hasher("crc32")
    mv = memoryview(data)
    for i in range(0, size, 4099):
        crc.update(mv[i:i + 4099])
    assert crc.digest() == zlib.crc32(data).to_bytes(4, "big")
    whole = new_hasher("crc32")
    whole.update(bytearray(data))
    assert whole.digest() == crc.digest()


@pytest.mark.parametrize("alg", ["crc32", "crc32c", "crc64nvme"])
@pytest.mark.parametrize("la,lb", [(0, 0), (0, 9), (9, 0), (1, 1), (100, 7), (12345, 100_003), (3, 1 << 20)])
def test_combine_crc_matches_concatenation_and_awscrt(alg, la, lb):
    """crc(A || B) from crc(A), crc(B), |B| (zlib's crc32_combine maths) equals
    the CRC of the concatenation and awscrt's own combine."""
    a, b = os.urandom(la), os.urandom(lb)
    fn = _CRC[alg]
    got = combine_crc(alg, fn(a), fn(b), lb)
    assert got == fn(a + b)
    assert got == getattr(awscrt, f"combine_{alg}")(fn(a), fn(b), lb)


def test_multipart_checksums_types():
    parts_data = [os.urandom(1000), os.urandom(2000), os.urandom(10)]
    parts = [({alg: _digest_b64(alg, d) for alg in ("crc32", "crc32c", "crc64nvme", "sha256")}, len(d))
             for d in parts_data]
    whole = b"".join(parts_data)
    full = multipart_checksums(parts, "FULL_OBJECT")
    assert full == {alg: _crc_b64(alg, whole) for alg in ("crc32", "crc32c", "crc64nvme")}
    comp = multipart_checksums(parts, "COMPOSITE")
    assert set(comp) == {"crc32", "crc32c", "sha256"}
    assert comp["sha256"] == composite_checksum("sha256", [ck["sha256"] for ck, _ in parts])
    assert comp["crc32"].endswith("-3")
    default = multipart_checksums(parts)
    assert default["crc64nvme"] == full["crc64nvme"] and default["crc32"] == comp["crc32"]
    assert full_object_checksum("crc32", [(ck["crc32"], n) for ck, n in parts]) == _crc_b64("crc32", whole)


# -- single-part uploads through boto3 --------------------------------------------------

@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"])
def test_put_each_algorithm_with_boto3(s3, bucket, algorithm):
    """botocore computes CRC64NVME only with awscrt installed; the node checks
    each value, stores it and returns it with ChecksumMode=ENABLED."""
    body = os.urandom(3 << 20)
    put = s3.put_object(Bucket=bucket, Key="k", Body=body, ChecksumAlgorithm=algorithm)
    want = _digest_b64(algorithm.lower(), body)
    assert put[f"Checksum{algorithm}"] == want
    head = s3.head_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert head[f"Checksum{algorithm}"] == want and head["ChecksumType"] == "FULL_OBJECT"
    got = s3.get_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert got["Body"].read() == body  # botocore validates the checksum on read


@pytest.mark.parametrize("alg", ["crc32", "crc32c", "crc64nvme", "sha1", "sha256"])
def test_put_wrong_and_malformed_values(raw, bkt, s3_node, code_of, alg):
    """A wrong value is 400 BadDigest; one that is not base64 of the right length
    is 400 InvalidRequest ("Value for x-amz-checksum-... header is invalid").
    Nothing is stored either way."""
    body = b"checked body" * 1000
    good = _digest_b64(alg, body)
    raw_good = base64.b64decode(good)
    wrong = _b64(bytes([raw_good[0] ^ 1]) + raw_good[1:])
    r = raw.request("PUT", f"/{bkt}/bad-{alg}", body=body, headers={f"x-amz-checksum-{alg}": wrong})
    assert r.status == 400 and code_of(r.body) == "BadDigest"
    for bad in ("not base64!", _b64(raw_good[:-1]), _b64(raw_good + b"x")):
        r = raw.request("PUT", f"/{bkt}/bad-{alg}", body=body, headers={f"x-amz-checksum-{alg}": bad})
        assert r.status == 400 and code_of(r.body) == "InvalidRequest", bad
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, f"bad-{alg}")
    r = raw.request("PUT", f"/{bkt}/bad-{alg}", body=body, headers={f"x-amz-checksum-{alg}": good})
    assert r.status == 200 and r.headers[f"x-amz-checksum-{alg}"] == good


# -- multipart ---------------------------------------------------------------------------

def _upload_parts(s3, bucket, key, upload_id, algorithm, datas):
    parts = []
    for n, data in enumerate(datas, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=data,
                           ChecksumAlgorithm=algorithm)
        assert r[f"Checksum{algorithm}"] == _digest_b64(algorithm.lower(), data)
        parts.append({"PartNumber": n, "ETag": r["ETag"], f"Checksum{algorithm}": r[f"Checksum{algorithm}"]})
    return parts


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME"])
def test_multipart_full_object(s3, s3_once, bucket, algorithm):
    """FULL_OBJECT: the object's checksum is the CRC of all its bytes, combined
    from the part CRCs; a client may send it at completion to have it checked."""
    datas = [os.urandom(_PART), os.urandom(_PART), os.urandom(1234)]
    whole = b"".join(datas)
    want = _crc_b64(algorithm.lower(), whole)
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", ChecksumAlgorithm=algorithm,
                                    ChecksumType="FULL_OBJECT")
    assert up["ChecksumAlgorithm"] == algorithm and up["ChecksumType"] == "FULL_OBJECT"
    parts = _upload_parts(s3, bucket, "mp", up["UploadId"], algorithm, datas)
    wrong = _crc_b64(algorithm.lower(), whole + b"x")
    with pytest.raises(ClientError) as ei:
        s3_once.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": parts}, **{f"Checksum{algorithm}": wrong})
    assert _code(ei.value) == "BadDigest"
    assert len(s3.list_parts(Bucket=bucket, Key="mp", UploadId=up["UploadId"])["Parts"]) == 3  # unchanged
    done = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                        MultipartUpload={"Parts": parts}, ChecksumType="FULL_OBJECT",
                                        **{f"Checksum{algorithm}": want})
    assert done[f"Checksum{algorithm}"] == want and done["ChecksumType"] == "FULL_OBJECT"
    head = s3.head_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")
    assert head[f"Checksum{algorithm}"] == want and head["ChecksumType"] == "FULL_OBJECT"
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == whole


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "SHA1", "SHA256"])
def test_multipart_composite_accepts_its_own_form(s3, s3_once, bucket, algorithm):
    """COMPOSITE: ``<base64 of H(part digests)>-<n>``; CompleteMultipartUpload
    accepts that very form (and the bare base64) and refuses another value."""
    datas = [os.urandom(_PART), os.urandom(4321)]
    up = s3.create_multipart_upload(Bucket=bucket, Key="cp", ChecksumAlgorithm=algorithm)
    assert up["ChecksumType"] == "COMPOSITE"
    parts = _upload_parts(s3, bucket, "cp", up["UploadId"], algorithm, datas)
    want = composite_checksum(algorithm.lower(), [p[f"Checksum{algorithm}"] for p in parts])
    assert want.endswith("-2")
    for bad in (want.replace("-2", "-3"), _digest_b64(algorithm.lower(), b"other") + "-2"):
        with pytest.raises(ClientError) as ei:
            s3_once.complete_multipart_upload(Bucket=bucket, Key="cp", UploadId=up["UploadId"],
                                         MultipartUpload={"Parts": parts}, **{f"Checksum{algorithm}": bad})
        assert _code(ei.value) == "BadDigest", bad
    done = s3.complete_multipart_upload(Bucket=bucket, Key="cp", UploadId=up["UploadId"],
                                        MultipartUpload={"Parts": parts}, **{f"Checksum{algorithm}": want})
    assert done[f"Checksum{algorithm}"] == want and done["ChecksumType"] == "COMPOSITE"
    head = s3.head_object(Bucket=bucket, Key="cp", ChecksumMode="ENABLED")
    assert head[f"Checksum{algorithm}"] == want and head["ChecksumType"] == "COMPOSITE"
    # the bare base64 (without -<n>) is accepted too
    up2 = s3.create_multipart_upload(Bucket=bucket, Key="cp2", ChecksumAlgorithm=algorithm)
    parts2 = _upload_parts(s3, bucket, "cp2", up2["UploadId"], algorithm, datas)
    done2 = s3.complete_multipart_upload(Bucket=bucket, Key="cp2", UploadId=up2["UploadId"],
                                         MultipartUpload={"Parts": parts2},
                                         **{f"Checksum{algorithm}": want.split("-")[0]})
    assert done2[f"Checksum{algorithm}"] == want


def test_multipart_crc64nvme_defaults_to_full_object(s3, bucket):
    datas = [os.urandom(_PART), b"tail"]
    up = s3.create_multipart_upload(Bucket=bucket, Key="nv", ChecksumAlgorithm="CRC64NVME")
    assert up["ChecksumType"] == "FULL_OBJECT"
    parts = _upload_parts(s3, bucket, "nv", up["UploadId"], "CRC64NVME", datas)
    done = s3.complete_multipart_upload(Bucket=bucket, Key="nv", UploadId=up["UploadId"],
                                        MultipartUpload={"Parts": parts})
    assert done["ChecksumCRC64NVME"] == _crc_b64("crc64nvme", b"".join(datas))
    assert done["ChecksumType"] == "FULL_OBJECT"


@pytest.mark.parametrize("algorithm,ctype", [
    ("SHA256", "FULL_OBJECT"), ("SHA1", "FULL_OBJECT"), ("CRC64NVME", "COMPOSITE"),
])
def test_create_refuses_undefined_combinations(s3, bucket, algorithm, ctype):
    with pytest.raises(ClientError) as ei:
        s3.create_multipart_upload(Bucket=bucket, Key="x", ChecksumAlgorithm=algorithm, ChecksumType=ctype)
    assert _code(ei.value) == "InvalidRequest"
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_create_checksum_header_errors(raw, bkt, code_of):
    for headers in ({"x-amz-checksum-type": "FULL_OBJECT"},
                    {"x-amz-checksum-algorithm": "MD5"},
                    {"x-amz-checksum-algorithm": "CRC32", "x-amz-checksum-type": "WHOLE"}):
        r = raw.request("POST", f"/{bkt}/hx?uploads", headers=headers)
        assert r.status == 400 and code_of(r.body) == "InvalidRequest", headers


def test_complete_bad_part_checksums(s3, bucket):
    """A part checksum in the document that differs from the uploaded part's is
    InvalidPart; a malformed one is InvalidArgument (as S3 answers: "Invalid
    Base64 or multiple checksums present in request"); a malformed whole-object
    value is InvalidRequest; a type other than the upload's is InvalidRequest.
    The upload stays open."""
    datas = [os.urandom(_PART), b"end"]
    up = s3.create_multipart_upload(Bucket=bucket, Key="bp", ChecksumAlgorithm="CRC32")
    uid = up["UploadId"]
    parts = _upload_parts(s3, bucket, "bp", uid, "CRC32", datas)

    def complete(parts, **kw):
        with pytest.raises(ClientError) as ei:
            s3.complete_multipart_upload(Bucket=bucket, Key="bp", UploadId=uid,
                                         MultipartUpload={"Parts": parts}, **kw)
        return _code(ei.value)

    assert complete([parts[0], {**parts[1], "ChecksumCRC32": _crc_b64("crc32", b"nope")}]) == "InvalidPart"
    assert complete([parts[0], {**parts[1], "ChecksumCRC32": "%%%"}]) == "InvalidArgument"
    assert complete(parts, ChecksumCRC32="AAAA") == "InvalidRequest"
    assert complete(parts, ChecksumCRC32="AAAAAA==-x") == "InvalidRequest"
    assert complete(parts, ChecksumType="FULL_OBJECT") == "InvalidRequest"
    assert len(s3.list_parts(Bucket=bucket, Key="bp", UploadId=uid)["Parts"]) == 2
    done = s3.complete_multipart_upload(Bucket=bucket, Key="bp", UploadId=uid, MultipartUpload={"Parts": parts})
    assert done["ChecksumType"] == "COMPOSITE"


# -- the event loop is never stalled by hashing -------------------------------------------

def _stream_put(raw, bucket: str, key: str, body: bytes, headers: dict, state: dict) -> None:
    """PUT ``body`` over a raw connection as fast as the server reads it."""
    try:
        signed = raw.sign("PUT", f"/{bucket}/{key}", headers=headers, payload_hash="UNSIGNED-PAYLOAD")
        conn = http.client.HTTPConnection("127.0.0.1", raw.port, timeout=120)
        conn.putrequest("PUT", f"/{bucket}/{key}", skip_host=True, skip_accept_encoding=True)
        for k, v in signed.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        mv = memoryview(body)
        state["started"] = time.perf_counter()
        for off in range(0, len(mv), 1 << 20):
            conn.send(mv[off:off + (1 << 20)])
        state["status"] = conn.getresponse().status
        conn.close()
    except Exception as exc:  # reported by the test
        state["error"] = exc
    finally:
        state["ended"] = time.perf_counter()


@pytest.mark.slow
def test_small_gets_proceed_during_checksummed_upload(node, s3, bucket, raw_for):
    """While one client uploads 192 MiB with CRC64NVME and SHA-256 checksums,
    another client's small GETs keep being answered (the hashing runs on
    worker threads in native code that releases the GIL). Bounds are generous
    (a shared 2-core machine): at least 5 GETs answered during the upload,
    median under 0.5 s, none over 5 s."""
    s3.put_object(Bucket=bucket, Key="small", Body=b"s" * 4096)
    body = os.urandom(1 << 20) * 192
    headers = {"x-amz-checksum-crc64nvme": _crc_b64("crc64nvme", body),
               "x-amz-checksum-sha256": _digest_b64("sha256", body)}
    state: dict = {}
    raw = raw_for(node.s3_url, node.access_key, node.secret_key)
    t = threading.Thread(target=_stream_put, args=(raw, bucket, "big", body, headers, state))
    t.start()
    latencies = []
    try:
        while "started" not in state and "ended" not in state:
            time.sleep(0.001)
        while "ended" not in state:
            t0 = time.perf_counter()
            assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == b"s" * 4096
            if "ended" not in state:
                latencies.append(time.perf_counter() - t0)
    finally:
        t.join(120)
    assert "error" not in state, state.get("error")
    assert state["status"] == 200
    head = s3.head_object(Bucket=bucket, Key="big", ChecksumMode="ENABLED")
    assert head["ChecksumCRC64NVME"] == headers["x-amz-checksum-crc64nvme"]
    assert len(latencies) >= 5, (latencies, state["ended"] - state["started"])
    assert statistics.median(latencies) < 0.5 and max(latencies) < 5.0, latencies
