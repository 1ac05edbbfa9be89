"""nodes/metrics.py: the node's hot-path histogram scrapes as prometheus_client's does."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from nodes.metrics import LATENCY_BUCKETS, LoopHistogram, NodeMetrics


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_loop_histogram_scrapes_like_prometheus_client():
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LoopHistogram("p2pfaas_x_seconds", "X", ["node", "fn"], LATENCY_BUCKETS, ours_registry)
    theirs = Histogram("p2pfaas_x_seconds", "X", ["node", "fn"], buckets=LATENCY_BUCKETS, registry=theirs_registry)
    rnd = random.Random(3)
    # bucket edges exactly (le is inclusive), values between them, past the last bound, zero
    values = [*LATENCY_BUCKETS, 0.0, 120.0, *(rnd.lognormvariate(-5, 3) for _ in range(2000))]
    for i, value in enumerate(values):
        labels = {"node": "n1", "fn": ("fib", "echo")[i % 2]}
        ours.labels(**labels).observe(value)
        theirs.labels(**labels).observe(value)
    assert _exposition(ours_registry) == _exposition(theirs_registry)
    echo_count = len(values[1::2])
    assert f'p2pfaas_x_seconds_bucket{{fn="echo",le="+Inf",node="n1"}} {echo_count}.0' in _exposition(ours_registry)


def test_node_metrics_count_results():
    metrics = NodeMetrics("n1")
    metrics.result("fib", 200, 0.002, 0.003)
    metrics.result("fib", 500, 0.001, 0.001)
    text = "\n".join(_exposition(metrics.registry))
    assert 'p2pfaas_execution_seconds_count{fn="fib",node="n1"} 1.0' in text
    assert 'p2pfaas_total_seconds_bucket{fn="fib",le="0.005",node="n1"} 1.0' in text
    assert metrics.invocations("fib") == 2


def test_loop_counter_scrapes_like_prometheus_client():
    from prometheus_client import Counter

    from nodes.metrics import LoopCounter

    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LoopCounter("p2pfaas_x", "X", ["node", "kind"], ours_registry)
    theirs = Counter("p2pfaas_x", "X", ["node", "kind"], registry=theirs_registry)
    rnd = random.Random(4)
    for _ in range(500):
        labels, amount = {"node": "n1", "kind": rnd.choice(["a", "b", "c"])}, rnd.choice([1, 1, 2.5])
        ours.labels(**labels).inc(amount)
        theirs.labels(**labels).inc(amount)
    assert _exposition(ours_registry) == _exposition(theirs_registry)
