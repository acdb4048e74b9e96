"""The JSON object body of an admin API request, read with a size limit."""

from __future__ import annotations

import json

from aiohttp import web

from ..errors import EntityTooLarge, MalformedXML

__all__ = ["read_json_object"]


async def read_json_object(request: web.BaseRequest, limit: int) -> dict:
    """The request's body as a JSON object (``{}`` for an empty body).

    Args:
        request: the admin API request.
        limit: most body bytes accepted.

    Raises:
        EntityTooLarge: the body is over ``limit`` bytes.
        MalformedXML: the body is not a JSON object (the admin API's
            "malformed body" answer, as for the S3 calls' XML).
    """
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise EntityTooLarge(f"the admin request body is over {limit} bytes")
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise MalformedXML("the admin request body is not JSON") from exc
    if not isinstance(body, dict):
        raise MalformedXML("the admin request body is not a JSON object")
    return body
