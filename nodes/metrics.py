"""Prometheus metrics of one node (its own registry; served over NATS and by the HTTP bridge)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


_ERROR_KINDS = {400: "bad_input", 404: "unknown_function", 504: "timeout"}


class NodeMetrics:
    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"node": node}
        self.requests = Counter("p2pfaas_requests", "Requests by scheduling outcome",
                                ["node", "fn", "outcome"], registry=self.registry)
        self.errors = Counter("p2pfaas_errors", "Refused or failed requests by kind",
                              ["node", "kind"], registry=self.registry)
        self.results = Counter("p2pfaas_results", "Results by HTTP-like status",
                               ["node", "fn", "status"], registry=self.registry)
        self.execution = Histogram("p2pfaas_execution_seconds", "Function execution time",
                                   ["node", "fn"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.total = Histogram("p2pfaas_total_seconds", "Arrival to result",
                               ["node", "fn"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.running = Gauge("p2pfaas_running", "Tasks executing", ["node"], registry=self.registry).labels(**labels)
        self.queued = Gauge("p2pfaas_queued", "Tasks waiting for a worker", ["node"], registry=self.registry).labels(**labels)
        self.workers = Gauge("p2pfaas_workers", "Workers by state", ["node", "state"], registry=self.registry)
        self.node = node
        self._children: dict[tuple, object] = {}   # labelled children, looked up once (hot path)

    def _child(self, metric, **labels):
        key = (metric, *labels.values())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(node=self.node, **labels)
        return child

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
