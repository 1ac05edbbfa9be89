"""Per-pool telemetry: what happened in one control period, as a ``PoolTelemetry`` sample."""

from __future__ import annotations

import numpy as np

from broker.messages import PoolPulse, PoolTelemetry

PULSE_PERIOD_S = 2.0   # a pool with a longer control period also sends a PoolPulse this often (controller/panic.py)


class PoolStats:
    def __init__(self, node: str, pool: str) -> None:
        self.node, self.pool = node, pool
        self._arrivals = 0
        self._pulse_arrivals = 0
        self._latencies: list[float] = []
        self._met = 0

    def arrived(self, count: int = 1) -> None:
        self._arrivals += count
        self._pulse_arrivals += count

    def pulse(self, now: float, window_s: float, *, queue_length: int, ready: int, starting: int) -> PoolPulse:
        """The state between control periods; starts the next pulse's window."""
        pulse = PoolPulse(node=self.node, pool=self.pool, time=now, window_s=window_s, arrivals=self._pulse_arrivals,
                          queue_length=max(0, queue_length), workers_ready=ready, workers_starting=starting)
        self._pulse_arrivals = 0
        return pulse

    def completed(self, latency_s: float, deadline_s: float | None, ok: bool) -> None:
        """One finished task; it met its QoS if it succeeded within its deadline (if it had one)."""
        self._latencies.append(latency_s)
        if ok and (deadline_s is None or latency_s <= deadline_s):
            self._met += 1

    def sample(self, now: float, period_s: float, *, queue_length: int, in_service: int,
               ready: int, starting: int, stopping: int) -> PoolTelemetry:
        """The period's sample; starts the next period."""
        lat = np.asarray(self._latencies, dtype=float)
        completed = len(lat)
        sample = PoolTelemetry(
            node=self.node, pool=self.pool, time=now, period_s=period_s,
            queue_length=max(0, queue_length), in_service=in_service,
            workers_ready=ready, workers_starting=starting, workers_stopping=stopping,
            arrivals=self._arrivals, completed=completed, met_deadline=self._met,
            arrival_rate=self._arrivals / period_s, throughput=completed / period_s,
            latency_mean_s=float(lat.mean()) if completed else 0.0,
            latency_p95_s=float(np.percentile(lat, 95)) if completed else 0.0,
            latency_max_s=float(lat.max()) if completed else 0.0,
            qos=self._met / completed if completed else 1.0,
        )
        self._arrivals, self._latencies, self._met = 0, [], 0
        return sample
