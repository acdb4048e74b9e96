"""The node's health answer: ``GET /_gpufeed/health`` on the S3 port (for load
balancers) and ``GET /health`` on the metrics port.

Unauthenticated on purpose: load balancers and probes do not sign requests.
It reveals only that a gpufeed node of some version is up and for how long;
no bucket, tenant or object names, no data.

A node is healthy when its catalog answers a trivial query (the tenant list)
through its engine; otherwise the answer is 503 with the same fields, and
``engine_open`` false when the engine has been closed.
"""

from __future__ import annotations

import json
import time

from aiohttp import web

from .._version import __version__
from ..engine import Engine
from ..errors import InternalError

__all__ = ["HEALTH_PATH", "health_report", "health_response"]

#: The health path of the S3 port; like the admin API, no bucket can shadow it.
HEALTH_PATH = "/_gpufeed/health"


def health_report(engine: Engine, started_s: float) -> tuple[int, dict]:
    """Check the node (blocking: one catalog query; run it off the event loop).

    Args:
        engine: the node's engine.
        started_s: Unix time the node started, seconds.

    Returns:
        ``(http_status, body)``: 200 or 503, and ``{"status": "ok" | "unhealthy",
        "version", "uptime_s", "engine_open", "catalog_readable"}`` plus
        ``"error"`` (what failed) when unhealthy.
    """
    body: dict = {"status": "ok", "version": __version__, "uptime_s": round(time.time() - started_s, 3),
                  "engine_open": True, "catalog_readable": False}
    try:
        engine.list_tenants()
        body["catalog_readable"] = True
    except InternalError as exc:  # a closed engine says so in these words (engine/_sqlite.py)
        body["engine_open"] = "engine is closed" not in exc.message
        body["error"] = "engine closed" if not body["engine_open"] else f"catalog query failed: {exc.message}"
    except Exception as exc:  # whatever else the catalog raises, the answer is "unhealthy"
        body["error"] = f"catalog query failed: {type(exc).__name__}"
    if not (body["engine_open"] and body["catalog_readable"]):
        body["status"] = "unhealthy"
        return 503, body
    return 200, body


def health_response(method: str, status: int, body: dict) -> web.Response:
    """The JSON answer (no body for ``HEAD``), never cached."""
    return web.Response(status=status, body=b"" if method == "HEAD" else json.dumps(body).encode(),
                        content_type="application/json", headers={"Cache-Control": "no-store"})
