"""The errors of the training-data datasets; each names the object it is about.

Tree (all :class:`~gpufeed.errors.GpufeedError`)::

    DataError                      base; ``bucket`` and ``key`` name the object
    ├── SampleMissing (NotFoundError)  the object was listed but is gone (deleted mid-epoch)
    ├── SampleChanged              the object's size is not the size listed (rewritten mid-epoch)
    ├── CorruptShard               a tar shard that does not parse (bad header, truncated)
    ├── SampleDecodeError          the ``decode`` function raised on a sample
    └── SampleReadError            the read failed (node down or restarted) after the retries
"""

from __future__ import annotations

from ...errors import GpufeedError, NotFoundError

__all__ = ["DataError", "SampleMissing", "SampleChanged", "CorruptShard", "SampleDecodeError",
           "SampleReadError"]


class DataError(GpufeedError):
    """Base of the dataset errors.

    Attributes:
        bucket: the bucket of the object the error is about.
        key: the object's key.
    """

    code, status = "DataError", 500

    def __init__(self, message: str = "", *, bucket: str = "", key: str = "", **details: object) -> None:
        super().__init__(message, bucket=bucket, key=key, **details)
        self.bucket = bucket
        self.key = key


class SampleMissing(DataError, NotFoundError):
    """A listed object is gone (deleted during the epoch)."""

    code, status = "NoSuchKey", 404


class SampleChanged(DataError):
    """A listed object now has another size (rewritten during the epoch): its
    bytes are not the sample that was listed, so they are not used."""

    code, status = "SampleChanged", 409


class CorruptShard(DataError):
    """A tar shard that does not parse: a header whose checksum is wrong, a
    member running past the end of the object, bytes after the end marker,
    or a sample with two files of the same extension."""

    code, status = "CorruptShard", 500


class SampleDecodeError(DataError):
    """The dataset's ``decode`` function raised on a sample (the cause is chained)."""

    code, status = "SampleDecodeError", 500


class SampleReadError(DataError):
    """Reading the object failed after the configured retries (the node went
    away, restarted, or timed out; the cause is chained)."""

    code, status = "SampleReadError", 503
