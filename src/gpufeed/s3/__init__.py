"""The S3 HTTP front of a node: routing, SigV4, XML in and out.

It calls :mod:`gpufeed.engine`, never the other way. Start it with
:func:`start_s3` (binds ``config.host:config.s3_port``; :func:`serve_s3` also
counts requests in a node's metrics) or mount
:func:`make_app` yourself.

Layout: ``_router`` turns a request into a typed endpoint; ``_buckets``,
``_listing``, ``_objects`` and ``_multipart`` hold the handlers of each
operation family; ``_app`` is the aiohttp glue (authentication, dispatch);
``_server`` the connections (timeouts, per-address cap, error documents,
access log); ``_auth``, ``_body``, ``_checksum``, ``_headers`` and ``_xml``
are the shared protocol pieces.
"""

from ._app import S3Front, make_app, serve_s3, start_s3
from ._headers import parse_range
from ._router import bucket_from_host

__all__ = ["S3Front", "make_app", "start_s3", "serve_s3", "bucket_from_host", "parse_range"]
