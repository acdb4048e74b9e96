"""S3 XML in and out: safe parsing of request documents, building responses.

Responses use the namespace ``http://s3.amazonaws.com/doc/2006-03-01/`` and
ISO 8601 dates with milliseconds (``2024-01-02T03:04:05.678Z``) as S3 does.
Request documents with a DOCTYPE or entity declarations are refused
(``MalformedXML``) so no entity expansion can happen.
"""

from __future__ import annotations

import email.utils
import time
import xml.etree.ElementTree as ET

from ..errors import MalformedXML

__all__ = [
    "S3_NS",
    "iso8601",
    "http_date",
    "parse_http_date",
    "parse_xml",
    "local",
    "child_text",
    "element",
    "sub",
    "to_bytes",
]

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def iso8601(t_s: float) -> str:
    """Unix seconds -> ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC)."""
    ms = int(round((t_s - int(t_s)) * 1000))
    whole = int(t_s)
    if ms == 1000:
        whole, ms = whole + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def http_date(t_s: float) -> str:
    """Unix seconds -> RFC 7231 IMF-fixdate (``Tue, 02 Jan 2024 03:04:05 GMT``)."""
    return email.utils.formatdate(int(t_s), usegmt=True)


def parse_http_date(value: str | None) -> float | None:
    """RFC 7231 date -> Unix seconds; ``None`` when absent or unparsable (ignored, per RFC)."""
    if not value:
        return None
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if dt is None:
        return None
    return dt.timestamp()


def parse_xml(body: bytes) -> ET.Element:
    """Parse a request document.

    Raises:
        MalformedXML: empty, not well-formed, or with a DOCTYPE / entity declaration.
    """
    head = body.lstrip()
    if not head:
        raise MalformedXML("The XML you provided was not well-formed or did not validate against our published schema.")
    upper = body.upper()
    if b"<!DOCTYPE" in upper or b"<!ENTITY" in upper:
        raise MalformedXML("DOCTYPE and entity declarations are not allowed")
    try:
        return ET.fromstring(body)
    except ET.ParseError as exc:
        raise MalformedXML(
            "The XML you provided was not well-formed or did not validate against our published schema."
        ) from exc


def local(tag: str) -> str:
    """Element tag without its ``{namespace}``."""
    return tag.rsplit("}", 1)[-1]


def child_text(el: ET.Element, name: str) -> str | None:
    """Text of the first child named ``name`` (any namespace), or None."""
    for c in el:
        if local(c.tag) == name:
            return c.text or ""
    return None


def element(tag: str) -> ET.Element:
    """A response root element in the S3 namespace."""
    return ET.Element(tag, xmlns=S3_NS)


def sub(parent: ET.Element, tag: str, text: object = None) -> ET.Element:
    """Append a child; ``text`` is converted with ``str`` (bools as ``true``/``false``)."""
    el = ET.SubElement(parent, tag)
    if text is not None:
        el.text = ("true" if text else "false") if isinstance(text, bool) else str(text)
    return el


def to_bytes(root: ET.Element) -> bytes:
    """Serialise with an XML declaration."""
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8")
