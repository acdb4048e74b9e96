"""Directory buckets (S3 Express One Zone semantics): names, kind and listing rules.

A directory bucket is a bucket of kind :data:`KIND` whose name has the form
``base-name--zone-id--x-s3``. It holds objects as any bucket does (the fast
path reads and writes it unchanged); what differs is on the S3 front: listing
is ListObjectsV2 only, with ``/`` as the only delimiter and prefixes ending in
``/``, and versioning, object lock and tagging are refused
(:mod:`gpufeed.s3._express`).

Hierarchy: a directory's entries are found by a seek to the directory's key
range in the catalog's ``(bucket, key)`` index, and each subdirectory is rolled
up and skipped with one more seek (:mod:`._listing`), so a listing reads the
rows of its own directory and never those of sibling directories: its cost
does not grow with the objects stored elsewhere in the bucket (measured by
``gpufeed bench list``, ``docs/bench/list.json``). Empty directories do not
exist: a directory is there while a key under it is, as S3 deletes empty
directories with their last object.

Sources: "Directory bucket naming rules", "Working with directory buckets"
and "How is S3 Express One Zone different?", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/directory-bucket-naming-rules.html
https://docs.aws.amazon.com/AmazonS3/latest/userguide/directory-buckets-overview.html
https://docs.aws.amazon.com/AmazonS3/latest/userguide/s3-express-differences.html
"""

from __future__ import annotations

import re

from ..errors import InvalidArgument, InvalidBucketName
from ._names import check_bucket_name

__all__ = ["KIND", "SUFFIX", "DELIMITER", "is_directory_name", "check_directory_bucket_name", "zone_id",
           "check_name_for_kind", "check_directory_listing"]

#: The bucket kind of a directory bucket.
KIND = "directory"
#: The suffix every directory bucket name ends with.
SUFFIX = "--x-s3"
#: The one delimiter a directory bucket listing accepts.
DELIMITER = "/"

_BASE_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")
_ZONE_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)+")  # usw2-az1, usw2-lax1-az1
_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")


def is_directory_name(name: str) -> bool:
    """Whether ``name`` has the directory bucket suffix ``--x-s3`` (no general
    purpose bucket may end with it, so this alone tells the two apart)."""
    return name.endswith(SUFFIX)


def check_directory_bucket_name(name: object) -> str:
    """Check a name against the directory bucket naming rules.

    Args:
        name: ``base-name--zone-id--x-s3``: 3-63 characters in all; the base of
            lower-case letters, digits and ``-``, starting and ending with a
            letter or digit, none of S3's reserved prefixes; the zone id such as
            ``usw2-az1``.

    Returns:
        The name, unchanged.

    Raises:
        InvalidBucketName: the name breaks a rule (the message says which).

    Source: "Directory bucket naming rules", Amazon S3 User Guide.
    """
    if not isinstance(name, str) or not 3 <= len(name) <= 63 or not name.endswith(SUFFIX):
        raise InvalidBucketName(f"invalid directory bucket name {name!r}: 3-63 characters ending "
                                f"in --zone-id{SUFFIX}", bucket=name)
    base, sep, zone = name[: -len(SUFFIX)].rpartition("--")
    if not sep or _BASE_RE.fullmatch(base) is None or _ZONE_RE.fullmatch(zone) is None:
        raise InvalidBucketName(f"invalid directory bucket name {name!r}: expected base-name--zone-id{SUFFIX} "
                                "with a base of [a-z0-9-] starting and ending with a letter or digit", bucket=name)
    if base.startswith(_BAD_PREFIXES):
        raise InvalidBucketName(f"invalid directory bucket name {name!r}: reserved prefix", bucket=name)
    return name


def zone_id(name: str) -> str:
    """The zone id of a valid directory bucket name (``usw2-az1``)."""
    return name[: -len(SUFFIX)].rpartition("--")[2]


def check_name_for_kind(name: object, kind: str) -> str:
    """Check a bucket name by the rules of its kind: the directory bucket rules
    for kind :data:`KIND`, the general purpose rules (which refuse the
    ``--x-s3`` suffix) for any other.

    Raises:
        InvalidBucketName: the name breaks a rule of its kind.
    """
    return check_directory_bucket_name(name) if kind == KIND else check_bucket_name(name)


def check_directory_listing(prefix: str, delimiter: str) -> None:
    """Check ListObjectsV2 arguments on a directory bucket.

    Raises:
        InvalidArgument: a delimiter other than ``/``, or, with a delimiter, a
            non-empty prefix that does not end in it.

    Source: "ListObjectsV2" (Delimiter, Prefix: "Directory buckets"), Amazon S3
    API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html
    """
    if delimiter and delimiter != DELIMITER:
        raise InvalidArgument("For directory buckets, / is the only supported delimiter.",
                              argument="delimiter", value=delimiter)
    if delimiter and prefix and not prefix.endswith(delimiter):
        raise InvalidArgument("For directory buckets, only prefixes that end in a delimiter (/) are supported.",
                              argument="prefix", value=prefix)
