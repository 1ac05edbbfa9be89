"""Per-pool telemetry bookkeeping (pure)."""

from __future__ import annotations

import pytest

from nodes.telemetry import PoolStats


def test_sample_summarises_the_period_and_starts_the_next():
    stats = PoolStats("n1", "sleep")
    stats.arrived(4)
    for latency, deadline, ok in [(1.0, 2.0, True), (3.0, 2.0, True), (0.5, None, True), (0.1, 2.0, False)]:
        stats.completed(latency, deadline, ok)
    t = stats.sample(100.0, 2.0, queue_length=3, in_service=1, ready=2, starting=1, stopping=0)
    assert (t.arrivals, t.completed, t.met_deadline) == (4, 4, 2)
    assert t.qos == pytest.approx(0.5) and t.arrival_rate == pytest.approx(2.0) and t.throughput == pytest.approx(2.0)
    assert t.latency_max_s == pytest.approx(3.0) and t.latency_mean_s == pytest.approx(1.15)
    assert (t.queue_length, t.in_service, t.workers_ready, t.workers_starting) == (3, 1, 2, 1)
    empty = stats.sample(102.0, 2.0, queue_length=0, in_service=0, ready=2, starting=0, stopping=0)
    assert (empty.arrivals, empty.completed, empty.qos, empty.latency_p95_s) == (0, 0, 1.0, 0.0)
