"""Request headers and parameters that name S3 features: accepted, echoed, or refused.

Clients name features in headers (encryption, object lock, tagging, ACLs,
storage classes). A store that ignores one misleads its client (an
object "retained" that a plain DELETE removes, an "encrypted" upload stored
as sent), so each is either built and honoured, or refused with 501
NotImplemented naming the feature. What gpufeed honours:

- ``x-amz-server-side-encryption: AES256``: data at rest is the node's
  business, as SSE-S3 is AWS's; the value is stored with the object and echoed
  on writes and reads, as S3 does. ``aws:kms`` and customer keys (SSE-C) are
  not built.
- canned ACLs ``private`` and ``bucket-owner-full-control`` (the node has one
  owner with full control of everything); any other ACL, or a grant header, is
  refused with S3's ``AccessControlListNotSupported`` (the answer of a bucket
  whose object ownership is "bucket owner enforced").
- ``x-amz-storage-class: STANDARD``.
- object lock and object tagging headers: read by ``_lock`` and ``_tagging``
  (``x-amz-bucket-object-lock-enabled: true`` on CreateBucket makes a bucket
  with object lock); object lock event holds are not built.

Sources: "PutObject", "CreateBucket", "GetObject", "Controlling ownership of
objects and disabling ACLs" and "Protecting data with server-side
encryption", Amazon S3 API Reference and User Guide.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import AccessControlListNotSupported, InvalidArgument, InvalidStorageClass, NotImplementedByGpufeed

__all__ = [
    "ACCEPTED_CANNED_ACLS",
    "check_acl_headers",
    "check_write_headers",
    "check_part_headers",
    "check_read_request",
    "check_create_bucket_headers",
    "check_request_headers",
    "sse_headers",
]

#: Canned ACLs that say what is true of every gpufeed bucket and object.
ACCEPTED_CANNED_ACLS = frozenset({"private", "bucket-owner-full-control"})
#: Canned ACLs S3 knows and gpufeed refuses (they would grant someone else access).
_OTHER_CANNED_ACLS = frozenset({
    "public-read", "public-read-write", "authenticated-read", "aws-exec-read", "bucket-owner-read",
    "log-delivery-write",
})
_GRANT_HEADERS = ("x-amz-grant-full-control", "x-amz-grant-read", "x-amz-grant-read-acp",
                  "x-amz-grant-write", "x-amz-grant-write-acp")
_NO_ACLS = "The bucket does not allow ACLs"

#: The storage classes S3 defines (any other is 400 InvalidStorageClass).
#: Source: "PutObject" (``x-amz-storage-class`` valid values), Amazon S3 API Reference.
_STORAGE_CLASSES = frozenset({
    "STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER",
    "DEEP_ARCHIVE", "OUTPOSTS", "GLACIER_IR", "SNOW", "EXPRESS_ONEZONE", "FSX_OPENZFS", "FSX_ONTAP",
})
#: Headers any request may carry that name a check gpufeed does not make.
_UNBUILT_REQUEST_HEADERS = {
    "x-amz-expected-bucket-owner": "the bucket owner account check (x-amz-expected-bucket-owner)",
    "x-amz-source-expected-bucket-owner": "the bucket owner account check (x-amz-source-expected-bucket-owner)",
}

_SSE_C = "server-side encryption with customer-provided keys (SSE-C)"
_SSE_KMS = "server-side encryption with AWS KMS keys (SSE-KMS)"
#: Headers that name a feature gpufeed does not build -> the feature named in the 501.
_UNBUILT_WRITE_HEADERS = {
    **{f"x-amz-object-lock-event-hold{suffix}": f"object lock event holds (x-amz-object-lock-event-hold{suffix})"
       for suffix in ("", "-duration-days", "-duration-years")},
    "x-amz-server-side-encryption-aws-kms-key-id": _SSE_KMS,
    "x-amz-server-side-encryption-context": _SSE_KMS,
    "x-amz-mfa": "MFA delete (x-amz-mfa)",
    "x-amz-write-offset-bytes": "appending to objects (x-amz-write-offset-bytes)",
}
_SSE_C_HEADERS = ("x-amz-server-side-encryption-customer-algorithm",
                  "x-amz-server-side-encryption-customer-key",
                  "x-amz-server-side-encryption-customer-key-md5")
_COPY_SSE_C_HEADERS = tuple(h.replace("x-amz-", "x-amz-copy-source-", 1) for h in _SSE_C_HEADERS)


def _not_built(feature: str) -> NotImplementedByGpufeed:
    return NotImplementedByGpufeed(f"{feature} is not implemented by gpufeed")


def check_acl_headers(headers: Mapping[str, str]) -> None:
    """Refuse an ``x-amz-acl`` / ``x-amz-grant-*`` that grants more than the owner's full control.

    Raises:
        AccessControlListNotSupported: a canned ACL other than ``private`` or
            ``bucket-owner-full-control``, or any grant header.
        InvalidArgument: an ``x-amz-acl`` that is no canned ACL at all.
    """
    acl = headers.get("x-amz-acl")
    if acl is not None:
        acl = acl.strip()
        if acl in _OTHER_CANNED_ACLS:
            raise AccessControlListNotSupported(f"{_NO_ACLS} (x-amz-acl: {acl}); only private and "
                                                "bucket-owner-full-control are accepted")
        if acl not in ACCEPTED_CANNED_ACLS:
            raise InvalidArgument(f"Invalid canned ACL: {acl!r}")
    for name in _GRANT_HEADERS:
        if name in headers:
            raise AccessControlListNotSupported(f"{_NO_ACLS} ({name})")


def _check_sse(headers: Mapping[str, str]) -> None:
    sse = headers.get("x-amz-server-side-encryption")
    if sse is not None and sse.strip() != "AES256":
        if sse.strip().startswith("aws:kms"):
            raise _not_built(_SSE_KMS)
        raise InvalidArgument("The encryption method specified is not supported",
                              argument_name="x-amz-server-side-encryption", argument_value=sse.strip())
    if headers.get("x-amz-server-side-encryption-bucket-key-enabled", "false").strip().lower() != "false":
        raise _not_built("S3 Bucket Keys for SSE-KMS (x-amz-server-side-encryption-bucket-key-enabled)")


def check_write_headers(headers: Mapping[str, str], *, copy: bool = False) -> None:
    """The feature headers of PutObject, CopyObject (``copy``) and CreateMultipartUpload.

    Raises:
        NotImplementedByGpufeed: object lock event holds, SSE-KMS, SSE-C, MFA,
            or a storage class other than STANDARD.
        InvalidStorageClass: a storage class S3 does not define.
        AccessControlListNotSupported, InvalidArgument: see :func:`check_acl_headers`;
            an unknown encryption method.
    """
    for name, feature in _UNBUILT_WRITE_HEADERS.items():
        if name in headers:
            raise _not_built(feature)
    for name in _SSE_C_HEADERS + (_COPY_SSE_C_HEADERS if copy else ()):
        if name in headers:
            raise _not_built(_SSE_C)
    _check_sse(headers)
    storage_class = headers.get("x-amz-storage-class")
    if storage_class is not None and storage_class.strip() != "STANDARD":
        if storage_class.strip() not in _STORAGE_CLASSES:
            raise InvalidStorageClass("The storage class you specified is not valid",
                                      storage_class_requested=storage_class.strip())
        raise _not_built(f"storage class {storage_class.strip()!r}")
    check_acl_headers(headers)


def check_part_headers(headers: Mapping[str, str], *, copy: bool = False) -> None:
    """The feature headers of UploadPart and UploadPartCopy (``copy``): SSE-C only.

    Raises:
        NotImplementedByGpufeed: SSE-C headers.
    """
    for name in _SSE_C_HEADERS + (_COPY_SSE_C_HEADERS if copy else ()):
        if name in headers:
            raise _not_built(_SSE_C)


def check_read_request(headers: Mapping[str, str], query: Mapping[str, str]) -> None:
    """The feature headers and parameters of GetObject / HeadObject.

    Raises:
        NotImplementedByGpufeed: SSE-C headers.
    """
    for name in _SSE_C_HEADERS:
        if name in headers:
            raise _not_built(_SSE_C)


def check_request_headers(headers: Mapping[str, str]) -> None:
    """The feature headers any S3 request may carry.

    Raises:
        NotImplementedByGpufeed: ``x-amz-expected-bucket-owner`` (or its copy
            source form): gpufeed has no account ids to check it against, and
            accepting it unchecked would pass a request S3 refuses with 403.
    """
    for name, feature in _UNBUILT_REQUEST_HEADERS.items():
        if name in headers:
            raise _not_built(feature)


def check_create_bucket_headers(headers: Mapping[str, str]) -> bool:
    """The feature headers of CreateBucket.

    Returns:
        Whether ``x-amz-bucket-object-lock-enabled`` asks for object lock.

    Raises:
        NotImplementedByGpufeed: an object ownership other than ``BucketOwnerEnforced``.
        InvalidArgument: ``x-amz-bucket-object-lock-enabled`` neither ``true`` nor ``false``.
        AccessControlListNotSupported, InvalidArgument: see :func:`check_acl_headers`.
    """
    lock = headers.get("x-amz-bucket-object-lock-enabled", "false").strip().lower()
    if lock not in ("true", "false"):
        raise InvalidArgument("x-amz-bucket-object-lock-enabled must be true or false")
    ownership = headers.get("x-amz-object-ownership")
    if ownership is not None and ownership.strip() != "BucketOwnerEnforced":
        raise _not_built(f"object ownership {ownership.strip()!r} (only BucketOwnerEnforced)")
    check_acl_headers(headers)
    return lock == "true"


def sse_headers(stored: Mapping[str, str]) -> dict[str, str]:
    """The ``x-amz-server-side-encryption`` echo of a request's or an object's headers (``{}`` if not asked)."""
    value = stored.get("x-amz-server-side-encryption")
    return {"x-amz-server-side-encryption": value.strip()} if value else {}
