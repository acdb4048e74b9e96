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
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
    """The registry's view of the scrape-time sources; a failing source is skipped."""

    def __init__(self, sources: list[Source], connections: dict[str, Callable[[], int]]) -> None:
        self._sources = sources
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        counts = []
        for front, count in list(self._connections.items()):
            try:
                counts.append(((front,), float(count())))
            except Exception:  # a front that has stopped
                continue
        yield gauge("gpufeed_connections_open", "Open connections, by front.", labels=("front",),
                    samples=counts)
        for source in list(self._sources):
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
    path's threads at once.
    """

    def __init__(self, *, tenant_labels: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.tenant_labels = tenant_labels
        #: Unix time the metrics (the node) started, seconds.
        self.started_s = time.time()
        r = self.registry
        self.requests = Counter("gpufeed_requests", "Requests answered.", ["front", "op", "status", "code"],
                                registry=r)
        self.latency = Histogram("gpufeed_request_duration_seconds", "Time to answer a request, seconds.",
                                 ["front", "op"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.received = Counter("gpufeed_received_bytes", "Request body bytes received (object data in).",
                                ["front"], registry=r)
        self.sent = Counter("gpufeed_sent_bytes", "Response body bytes sent (object data out).",
                            ["front"], registry=r)
        self.errors = Counter("gpufeed_errors", "Error answers, by error code.", ["front", "code"],
                              registry=r)
        self.lifecycle_passes = Counter("gpufeed_lifecycle_passes", "Lifecycle worker passes.", ["result"],
                                        registry=r)
        self.lifecycle_actions = Counter("gpufeed_lifecycle_actions", "What lifecycle passes did.",
                                         ["action"], registry=r)
        # label values -> (request counter, latency histogram, error counter or None)
        self._children: dict[tuple[str, str, int, str], tuple] = {}
        self._bytes: dict[str, tuple] = {}  # front -> (received, sent)
        self._sources: list[Source] = []
        self._connections: dict[str, Callable[[], int]] = {}
        self.registry.register(_Sources(self._sources, self._connections))

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
        children = self._children.get(key)
        if children is None:
            children = self._children.setdefault(key, (
                self.requests.labels(front, op, str(status), key[3]),
                self.latency.labels(front, op),
                self.errors.labels(front, code) if code else None))
        children[0].inc()
        children[1].observe(duration_s)
        if children[2] is not None:
            children[2].inc()
        if received or sent:
            pair = self._bytes.get(front)
            if pair is None:
                pair = self._bytes.setdefault(front, (self.received.labels(front), self.sent.labels(front)))
            if received:
                pair[0].inc(received)
            if sent:
                pair[1].inc(sent)

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
