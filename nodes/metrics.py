"""Prometheus metrics of one node (its own registry; served over NATS and by the HTTP bridge)."""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterator, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

COLD_START_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


_ERROR_KINDS = {400: "bad_input", 404: "unknown_function", 504: "timeout"}


class _LoopMetric:
    """A labelled Prometheus metric for code on one event loop: plain series updated without a lock,
    scraped as prometheus_client's own are."""

    _type = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        # named as prometheus_client's own metrics name them (the dashboards read these)
        self._name, self._documentation = name, documentation
        self._labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], object] = {}
        registry.register(self)

    def labels(self, **labels: str):
        key = tuple(str(labels[name]) for name in self._labelnames)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new_series()
        return series

    def _new_series(self):
        raise NotImplementedError


class LoopHistogram(_LoopMetric):
    """A histogram whose ``observe`` is a bisect and two additions (prometheus_client's takes a lock)."""

    _type = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.bounds = [float(b) for b in buckets if b != float("inf")] + [float("inf")]
        super().__init__(name, documentation, labelnames, registry)

    def _new_series(self) -> "_Series":
        return _Series(self.bounds)

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = self.describe()[0]
        for key, series in list(self._series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(self.bounds, list(series.counts)):   # type: ignore[attr-defined]
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(list(key), buckets, sum_value=series.sum)   # type: ignore[attr-defined]
        yield family


class LoopCounter(_LoopMetric):
    """A counter whose ``inc`` adds to a float, where prometheus_client's takes a lock."""

    _type = "counter"

    def _new_series(self) -> "_Count":
        return _Count()

    def describe(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = self.describe()[0]
        for key, series in list(self._series.items()):
            family.add_metric(list(key), series.value)   # type: ignore[attr-defined]
        yield family


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Series:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds, self.counts, self.sum = bounds, [0] * len(bounds), 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1   # le: the first bound >= value
        self.sum += value


class NodeMetrics:
    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"node": node}
        self.requests = LoopCounter("p2pfaas_requests", "Requests by scheduling outcome",
                                    ["node", "fn", "outcome"], self.registry)
        self.errors = LoopCounter("p2pfaas_errors", "Refused or failed requests by kind", ["node", "kind"], self.registry)
        self.results = LoopCounter("p2pfaas_results", "Results by HTTP-like status", ["node", "fn", "status"],
                                   self.registry)
        self.execution = LoopHistogram("p2pfaas_execution_seconds", "Function execution time",
                                       ["node", "fn"], LATENCY_BUCKETS, self.registry)
        self.total = LoopHistogram("p2pfaas_total_seconds", "Arrival to result",
                                   ["node", "fn"], LATENCY_BUCKETS, self.registry)
        self.running = Gauge("p2pfaas_running", "Tasks executing", ["node"], registry=self.registry).labels(**labels)
        self.queued = Gauge("p2pfaas_queued", "Tasks waiting for a worker", ["node"], registry=self.registry).labels(**labels)
        self.workers = Gauge("p2pfaas_workers", "Workers by state", ["node", "state"], registry=self.registry)
        # Knative's activator metric: a pool woken from zero, until its first worker is ready
        self.cold_starts = LoopHistogram("p2pfaas_cold_start_seconds", "A pool scaled to zero: from the call that "
                                         "woke it to its first ready worker", ["node", "pool"], COLD_START_BUCKETS,
                                         self.registry)
        self.pool_workers = Gauge("p2pfaas_pool_workers", "Workers of each pool by state (target: what it is "
                                  "scaled to)", ["node", "pool", "state"], registry=self.registry)
        self.node = node
        self._children: dict[tuple, object] = {}   # labelled children, looked up once (hot path)

    def _child(self, metric, **labels):
        key = (metric, *labels.values())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(node=self.node, **labels)
        return child

    def cold_start(self, pool: str, seconds: float) -> None:
        self.cold_starts.labels(node=self.node, pool=pool).observe(seconds)

    def error(self, kind: str) -> None:
        self._child(self.errors, kind=kind).inc()

    def request(self, fn: str, outcome: str) -> None:
        """A scheduling outcome: scheduled, forwarded or rejected."""
        self._child(self.requests, fn=fn, outcome=outcome).inc()

    def result(self, fn: str, status: int, execution_s: float, total_s: float) -> None:
        self._child(self.results, fn=fn, status=str(status)).inc()
        if status == 200:
            self._child(self.execution, fn=fn).observe(execution_s)
            self._child(self.total, fn=fn).observe(total_s)
        else:
            self.error(_ERROR_KINDS.get(status, "function_error"))

    def invocations(self, fn: str) -> float:
        """Answers given for ``fn`` so far, whatever their status (OpenFaaS's invocationCount)."""
        return sum(s.value for m in self.results.collect() for s in m.samples
                   if s.name.endswith("_total") and s.labels.get("fn") == fn)
