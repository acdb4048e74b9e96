"""The S3 access log (one JSON line per request) and a rate-limited warning.

Each line is one JSON object with the fields of :data:`FIELDS`; the same
request id is sent to the client as ``x-amz-request-id``. Lines are written
from the event loop as each response completes, line-buffered, so ``tail -f``
shows them at once.

Source for the fields: "Amazon S3 server access log format",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/LogFormat.html
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

__all__ = ["AccessLog", "RateLimitedWarning", "FIELDS"]

#: The fields of every access-log line, in order.
FIELDS = ("time", "remote", "access_key", "method", "bucket", "key", "status", "error", "bytes",
          "duration_s", "request_id")


class AccessLog:
    """Where access-log lines go.

    Args:
        target: a file path (opened for append), ``"-"`` for stdout, or ``None``
            (no access log: :meth:`write` does nothing).

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, target: str | None) -> None:
        self._file: IO[str] | None = None
        self._owned = False
        if target == "-":
            self._file = sys.stdout
        elif target:
            self._file = open(target, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._owned = True

    @property
    def enabled(self) -> bool:
        """Whether lines are written anywhere."""
        return self._file is not None

    def write(self, record: dict[str, Any]) -> None:
        """Write one line: ``record``'s :data:`FIELDS` (missing ones as ``null``) as JSON.

        ``time`` is filled in (UTC, ISO 8601 with milliseconds) when absent.
        Non-ASCII text is escaped, so a key holding newlines stays on one line.
        """
        if self._file is None:
            return
        if "time" not in record:
            now = time.time()
            record["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        line = json.dumps({name: record.get(name) for name in FIELDS}, separators=(",", ":"))
        try:
            self._file.write(line + "\n")
        except (OSError, ValueError):  # a full disk or a closed stdout must not fail the request
            pass

    def close(self) -> None:
        """Close the file (stdout is left open). Idempotent."""
        if self._owned and self._file is not None:
            self._file.close()
        self._file = None


class RateLimitedWarning:
    """A ``logger.warning`` written at most once per ``interval_s``; the next one
    says how many were held back in between.

    Args:
        logger: where the warnings go.
        interval_s: least seconds between two warnings.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._next = 0.0
        self._held = 0

    def warn(self, msg: str, *args: object) -> None:
        """Log ``msg % args`` at WARNING unless one was logged less than ``interval_s`` ago."""
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return
        self._next = now + self._interval_s
        if self._held:
            msg += " (%d more like it in the last %.0f s not shown)"
            args = (*args, self._held, self._interval_s)
            self._held = 0
        self._logger.warning(msg, *args)
