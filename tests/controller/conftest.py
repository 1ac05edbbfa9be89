"""Shared helpers for the autoscaling tests: small scenarios and hand-made telemetry."""

from __future__ import annotations

from typing import Any

import pytest

from broker.messages import PoolTelemetry
from controller.scenario import Scenario


def make_scenario(**overrides: Any) -> Scenario:
    """A small valid scenario; keyword arguments replace top-level fields."""
    data: dict[str, Any] = {
        "name": "test",
        "step_seconds": 5.0,
        "workers": {"min": 1, "max": 16, "initial": 4},
        "cold_start_seconds": 0.0,
        "scale_down_seconds": 0.0,
        "service_time": {"dist": "constant", "value": 2.0},
        "deadline": {"factor": 2.0},
        "phases": [{"duration_s": 100.0, "rate_per_s": 1.0}],
    }
    data.update(overrides)
    return Scenario.model_validate(data)


def telemetry(**fields: Any) -> PoolTelemetry:
    """Telemetry of an idle 10-worker pool at t = 100 s, with ``fields`` replaced."""
    values: dict[str, Any] = {
        "node": "n", "pool": "p", "time": 100.0, "period_s": 8.0,
        "queue_length": 0, "in_service": 0, "workers_ready": 10, "workers_starting": 0,
        "arrivals": 0, "completed": 0, "met_deadline": 0, "arrival_rate": 0.0, "throughput": 0.0,
        "latency_mean_s": 0.0, "latency_p95_s": 0.0, "latency_max_s": 0.0, "qos": 1.0,
    }
    values.update(fields)
    return PoolTelemetry(**values)


@pytest.fixture
def scenario() -> Scenario:
    return make_scenario()
