"""A node's Prometheus metrics: what both fronts count, and what is read at scrape time.

One :class:`NodeMetrics` per node, each with its own
``prometheus_client.CollectorRegistry`` (never the process-wide default), so
several nodes in one process (tests) keep apart. The fronts call
:meth:`NodeMetrics.observe` once per request: the S3 front from its access-log
hook, the fast path where each reply leaves. State that already lives
elsewhere (open connections, lent shared memory, tenants' usage) is not
mirrored into gauges on every change; it is read when Prometheus scrapes,
through the sources given to :meth:`NodeMetrics.add_source`.

Metric families (every name starts with ``gpufeed_``):

===================================== ========= ======================================
name                                   labels    meaning
===================================== ========= ======================================
``requests_total``                     front, op, status, code   requests answered
``request_duration_seconds``           front, op  request latency histogram
``received_bytes_total``               front     object bytes received
``sent_bytes_total``                   front     object bytes sent
``errors_total``                       front, code  error answers by error code
``lifecycle_passes_total``             result    lifecycle worker passes (``ok``, ``failed``)
``lifecycle_actions_total``            action    what those passes did
===================================== ========= ======================================

``front`` is ``s3``, ``tcp`` or ``shm``; ``op`` the S3 operation (``GetObject``)
or fast-path op (``get``); ``status`` the HTTP status (the status the error
maps to on the fast path, 200 for success); ``code`` the error code, ``OK`` for
success. Scrape-time families are listed in ``_monitor.py`` and the README.

Source: Prometheus exposition format and naming,
https://prometheus.io/docs/practices/naming/
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["NodeMetrics", "CachedSource", "gauge", "CONTENT_TYPE"]

#: Content type of :meth:`NodeMetrics.render` (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Latency buckets, seconds: 50 us (a small shm read) to 60 s (a large upload).
LATENCY_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                     0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: A scrape-time source: yields finished metric families.
Source = Callable[[], Iterable[Metric]]


def gauge(name: str, doc: str, value: float | None = None, labels: tuple[str, ...] = (),
          samples: Iterable[tuple[tuple[str, ...], float]] = ()) -> GaugeMetricFamily:
    """A gauge family: one unlabelled ``value``, or ``samples`` of ``(label values, value)``."""
    family = GaugeMetricFamily(name, doc, value=value, labels=None if value is not None else labels)
    for label_values, v in samples:
        family.add_metric(list(label_values), v)
    return family


class CachedSource:
    """A source computed at most once per ``ttl_s``: scrapes in between (and
    concurrent ones) get the families of the last pass.

    Args:
        compute: returns the families (may be slow: one pass over the catalog).
        ttl_s: seconds a result is reused.
    """

    def __init__(self, compute: Callable[[], list[Metric]], ttl_s: float) -> None:
        self._compute = compute
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._families: list[Metric] = []
        #: passes run so far (tests check that scrapes share them)
        self.passes = 0

    def __call__(self) -> list[Metric]:
        with self._lock:
            if time.monotonic() - self._at >= self._ttl_s:
                self._families = self._compute()
                self._at = time.monotonic()
                self.passes += 1
            return self._families


class _Sources(Collector):
    """The registry's view of the request tallies and the scrape-time sources;
    a failing source is skipped."""

    def __init__(self, metrics: "NodeMetrics") -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        yield from m._request_families()
        counts = []
        for front, count in list(m._connections.items()):
            try:
                counts.append(((front,), float(count())))
            except Exception:  # a front that has stopped
                continue
        yield gauge("gpufeed_connections_open", "Open connections, by front.", labels=("front",),
                    samples=counts)
        for source in list(m._sources):
            try:
                families = list(source())
            except Exception:  # a closed engine or server: leave its families out
                continue
            yield from families


class NodeMetrics:
    """The metrics of one node.

    Args:
        tenant_labels: whether per-tenant families (with a ``tenant`` label) are
            exported; the scrape-time source reads it.

    Thread-safe: :meth:`observe` is called from the S3 event loop and the fast
    path's threads at once. Requests are tallied in plain integers under one
    lock (about a microsecond a request) and turned into the counter and
    histogram families only when scraped.
    """

    def __init__(self, *, tenant_labels: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.tenant_labels = tenant_labels
        #: Unix time the metrics (the node) started, seconds.
        self.started_s = time.time()
        r = self.registry
        self.lifecycle_passes = Counter("gpufeed_lifecycle_passes", "Lifecycle worker passes.", ["result"],
                                        registry=r)
        self.lifecycle_actions = Counter("gpufeed_lifecycle_actions", "What lifecycle passes did.",
                                         ["action"], registry=r)
        self._lock = threading.Lock()
        # (front, op, status, code) -> [count, seconds summed, per-bucket counts (last: +Inf)]
        self._tallies: dict[tuple[str, str, int, str], list] = {}
        self._bytes: dict[str, list[int]] = {}  # front -> [received, sent]
        self._sources: list[Source] = []
        self._connections: dict[str, Callable[[], int]] = {}
        self.registry.register(_Sources(self))

    def observe(self, front: str, op: str, status: int, code: str | None, duration_s: float,
                received: int = 0, sent: int = 0) -> None:
        """Count one answered request.

        Args:
            front: ``"s3"``, ``"tcp"`` or ``"shm"``.
            op: the operation's name.
            status: HTTP status of the answer.
            code: the error code, ``None`` for success.
            duration_s: seconds from the request's start to its answer.
            received, sent: object/body bytes in and out, bytes.
        """
        key = (front, op, status, code or "OK")
        slot = bisect_left(LATENCY_BUCKETS_S, duration_s)  # first bound >= duration ("le")
        with self._lock:
            tally = self._tallies.get(key)
            if tally is None:
                tally = self._tallies[key] = [0, 0.0, [0] * (len(LATENCY_BUCKETS_S) + 1)]
            tally[0] += 1
            tally[1] += duration_s
            tally[2][slot] += 1
            if received or sent:
                pair = self._bytes.get(front)
                if pair is None:
                    pair = self._bytes[front] = [0, 0]
                pair[0] += received
                pair[1] += sent

    def _request_families(self) -> list[Metric]:
        """The tallies as ``requests``, ``errors``, ``request_duration_seconds`` and byte families."""
        with self._lock:
            tallies = [(k, t[0], t[1], list(t[2])) for k, t in self._tallies.items()]
            moved = [(f, p[0], p[1]) for f, p in self._bytes.items()]
        requests = CounterMetricFamily("gpufeed_requests", "Requests answered.",
                                       labels=["front", "op", "status", "code"])
        errors = CounterMetricFamily("gpufeed_errors", "Error answers, by error code.", labels=["front", "code"])
        latency = HistogramMetricFamily("gpufeed_request_duration_seconds", "Time to answer a request, seconds.",
                                        labels=["front", "op"])
        received = CounterMetricFamily("gpufeed_received_bytes", "Request body bytes received (object data in).",
                                       labels=["front"])
        sent = CounterMetricFamily("gpufeed_sent_bytes", "Response body bytes sent (object data out).",
                                   labels=["front"])
        by_code: dict[tuple[str, str], int] = {}
        by_op: dict[tuple[str, str], tuple[float, list[int]]] = {}
        for (front, op, status, code), count, sum_s, slots in tallies:
            requests.add_metric([front, op, str(status), code], count)
            if code != "OK":
                by_code[(front, code)] = by_code.get((front, code), 0) + count
            total_s, acc = by_op.get((front, op), (0.0, [0] * len(slots)))
            by_op[(front, op)] = (total_s + sum_s, [a + b for a, b in zip(acc, slots)])
        for (front, code), count in by_code.items():
            errors.add_metric([front, code], count)
        for (front, op), (sum_s, slots) in by_op.items():
            cumulative = list(accumulate(slots))
            bounds = [*(floatToGoString(b) for b in LATENCY_BUCKETS_S), "+Inf"]
            latency.add_metric([front, op], list(zip(bounds, cumulative)), sum_s)
        for front, n_in, n_out in moved:
            received.add_metric([front], n_in)
            sent.add_metric([front], n_out)
        return [requests, latency, received, sent, errors]

    def lifecycle_pass(self, done: dict[str, int] | None) -> None:
        """Count one lifecycle pass: ``done`` maps action -> count, ``None`` when it failed."""
        self.lifecycle_passes.labels("failed" if done is None else "ok").inc()
        for action, n in (done or {}).items():
            if n:
                self.lifecycle_actions.labels(action).inc(n)

    def count_connections(self, front: str, count: Callable[[], int]) -> None:
        """Report ``count()`` as the open connections of ``front`` at each scrape."""
        self._connections[front] = count

    def add_source(self, source: Source) -> None:
        """Read ``source`` at every scrape (wrap slow ones in :class:`CachedSource`)."""
        self._sources.append(source)

    def render(self) -> bytes:
        """Every family in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
