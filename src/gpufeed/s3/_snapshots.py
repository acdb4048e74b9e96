"""Reading a bucket as of one of its snapshots over S3: the ``snapshot`` query parameter.

GetObject, HeadObject, ListObjects and ListObjectsV2 take ``?snapshot=NAME``
and answer from the snapshot's record instead of the live bucket, with the
same handlers and the same read path (one catalog lookup, then ``sendfile``
of the shared data file)::

    GET /bucket/key?snapshot=nightly          the object as snapshot "nightly" recorded it
    GET /bucket?list-type=2&snapshot=nightly  its keys

Why a query parameter rather than a ``bucket@snapshot`` alias: S3 clients
(botocore among them) validate bucket names and refuse ``@``, and a
parameter leaves routing, signing and bucket policies as they are (the
request is on the bucket, asking ``s3:GetObject`` / ``s3:ListBucket``).
Snapshots are read-only: any other call that names a snapshot is refused
with 405 ``MethodNotAllowed``; a missing snapshot is 404 ``NoSuchSnapshot``;
a malformed name 400 ``InvalidArgument``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import InvalidArgument, MethodNotAllowed
from ._router import Endpoint, GetObject, HeadObject, ListObjects

__all__ = ["SNAPSHOT_PARAM", "snapshot_arg", "check_snapshot_request"]

#: The query parameter that names a snapshot.
SNAPSHOT_PARAM = "snapshot"
_READS = (GetObject, HeadObject, ListObjects)


def snapshot_arg(query: Mapping[str, str]) -> str | None:
    """The ``snapshot`` query parameter, or ``None``; the engine checks its form.

    Raises:
        InvalidArgument: an empty value, or the parameter given more than once.
    """
    getall = getattr(query, "getall", None)
    if getall is not None and len(getall(SNAPSHOT_PARAM, [])) > 1:
        raise InvalidArgument("the snapshot parameter may be given once", argument_name=SNAPSHOT_PARAM)
    name = query.get(SNAPSHOT_PARAM)
    if name == "":
        raise InvalidArgument("snapshot name cannot be the empty string", argument_name=SNAPSHOT_PARAM)
    return name


def check_snapshot_request(endpoint: Endpoint, query: Mapping[str, str]) -> None:
    """Refuse a call other than the reads above that names a snapshot.

    Raises:
        MethodNotAllowed: a write (or any other call) through a snapshot.
    """
    if SNAPSHOT_PARAM in query and not isinstance(endpoint, _READS):
        raise MethodNotAllowed(f"snapshot {query[SNAPSHOT_PARAM]!r} is read-only: only GetObject, HeadObject "
                               f"and ListObjects(V2) can name it, not {type(endpoint).__name__}")
