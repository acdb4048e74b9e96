"""The S3 HTTP front of a node: routing, SigV4, XML in and out.

It calls :mod:`gpufeed.engine`, never the other way. Start it with
:func:`start_s3` (binds ``config.host:config.s3_port``) or mount
:func:`make_app` yourself.
"""

from ._app import S3Front, bucket_from_host, make_app, parse_range, start_s3

__all__ = ["S3Front", "make_app", "start_s3", "bucket_from_host", "parse_range"]
