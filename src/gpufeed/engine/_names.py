"""Validation of bucket names and keys, and the key-space arithmetic listings need.

Kept apart from the engine so the rules (which come from S3, not from us) sit
in one short file with their sources.
"""

from __future__ import annotations

import base64
import binascii
import re

from ..errors import InvalidArgument, InvalidBucketName, KeyTooLong

__all__ = [
    "MAX_KEY_BYTES",
    "check_bucket_name",
    "check_key",
    "check_text",
    "check_str_map",
    "successor",
    "encode_token",
    "decode_token",
]

#: Largest key S3 accepts, bytes of UTF-8.
MAX_KEY_BYTES = 1024

# "Bucket naming rules", Amazon S3 User Guide:
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_RE = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BAD_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def check_bucket_name(name: object) -> str:
    """Check a bucket name against the S3 general-purpose bucket naming rules.

    Args:
        name: the candidate name: 3-63 characters of lower-case letters,
            digits, ``.`` and ``-``, starting and ending with a letter or digit,
            no ``..``, not shaped like an IPv4 address, none of S3's reserved
            prefixes and suffixes.

    Returns:
        The name, unchanged.

    Raises:
        InvalidBucketName: the name breaks a rule (the message says which).
    """
    if not isinstance(name, str) or _BUCKET_RE.fullmatch(name) is None:
        raise InvalidBucketName(
            f"invalid bucket name {name!r}: 3-63 of [a-z0-9.-], starting and ending with a letter or digit",
            bucket=name,
        )
    if ".." in name or ".-" in name or "-." in name:
        raise InvalidBucketName(f"invalid bucket name {name!r}: adjacent '.'/'-'", bucket=name)
    if _IP_RE.fullmatch(name):
        raise InvalidBucketName(f"invalid bucket name {name!r}: looks like an IP address", bucket=name)
    if name.startswith(_BAD_PREFIXES) or name.endswith(_BAD_SUFFIXES):
        raise InvalidBucketName(f"invalid bucket name {name!r}: reserved prefix or suffix", bucket=name)
    return name


def check_key(key: object) -> str:
    """Check an object key: a ``str`` of 1..1,024 UTF-8 bytes.

    Any character S3 accepts is accepted, ``NUL``, ``%`` and ``../`` included:
    keys never become file names. Strings holding lone surrogates (which have
    no UTF-8 form) are refused.

    Args:
        key: the candidate key.

    Returns:
        The key, unchanged.

    Raises:
        InvalidArgument: not a ``str``, empty, or not encodable as UTF-8.
        KeyTooLong: more than :data:`MAX_KEY_BYTES` bytes of UTF-8.
    """
    if not isinstance(key, str):
        raise InvalidArgument(f"object key must be str, not {type(key).__name__}")
    if key.isascii():
        n = len(key)
    else:
        try:
            n = len(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"object key {key!r} is not valid UTF-8") from exc
    if n == 0:
        raise InvalidArgument("object key must not be empty")
    if n > MAX_KEY_BYTES:
        raise KeyTooLong(f"object key is {n} bytes of UTF-8; the limit is {MAX_KEY_BYTES}", size=n)
    return key


def check_text(value: object, what: str) -> str:
    """Check a listing argument (prefix, delimiter, marker) is UTF-8 encodable ``str``.

    Raises:
        InvalidArgument: not a ``str`` or not encodable as UTF-8.
    """
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be str, not {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"{what} {value!r} is not valid UTF-8") from exc
    return value


def check_str_map(d: dict[str, str] | None) -> None:
    """Check user metadata, checksums or headers: a mapping of ``str`` to ``str`` (or empty/``None``).

    Raises:
        InvalidArgument: a name or value is not a ``str``.
    """
    if d and not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise InvalidArgument("metadata, checksums and headers must map str to str")


def successor(s: str) -> str | None:
    """The smallest string greater than every string that starts with ``s``.

    Code-point order equals UTF-8 byte order, so this is also the bound in the
    catalog's ``BINARY`` collation: ``k.startswith(s)`` iff ``s <= k < successor(s)``.

    Args:
        s: a non-empty prefix.

    Returns:
        ``s`` with its last character that is not U+10FFFF incremented (skipping
        the surrogate block) and the rest dropped; ``None`` when there is no such
        string (``s`` is empty or all U+10FFFF), meaning "to the end".
    """
    for i in range(len(s) - 1, -1, -1):
        c = ord(s[i])
        if c < 0x10FFFF:
            c += 1
            if 0xD800 <= c <= 0xDFFF:
                c = 0xE000
            return s[:i] + chr(c)
    return None


def encode_token(kind: str, value: str) -> str:
    """Make an opaque continuation token.

    Args:
        kind: ``"k"`` (resume after this key) or ``"p"`` (resume after every key
            under this common prefix).
        value: the last key or common prefix returned.

    Returns:
        URL-safe base64 text.
    """
    return base64.urlsafe_b64encode(kind.encode() + value.encode("utf-8")).decode("ascii")


def decode_token(token: str) -> tuple[str, str]:
    """Inverse of :func:`encode_token`.

    Returns:
        ``(kind, value)``.

    Raises:
        InvalidArgument: the token is not one we made.
    """
    try:
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
        kind, value = raw[:1].decode("ascii"), raw[1:].decode("utf-8")
    except (AttributeError, UnicodeError, binascii.Error, ValueError) as exc:
        raise InvalidArgument("the continuation token is not valid", token=token) from exc
    if kind not in ("k", "p") or not value:
        raise InvalidArgument("the continuation token is not valid", token=token)
    return kind, value
