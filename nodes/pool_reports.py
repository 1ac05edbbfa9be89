"""What a pool tells its controller: one ``PoolTelemetry`` per control period and, between long
periods, a ``PoolPulse`` every PULSE_PERIOD_S (nodes/telemetry.py keeps the counts)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.aio.client import Client

from broker.codec import encode
from broker.lifecycle import still_wanted
from nodes.pool import WorkerPool
from nodes.telemetry import PULSE_PERIOD_S, PoolStats


async def send_pulses(nc: Client, subject: str, stats: PoolStats, pool: WorkerPool) -> None:
    """A ``PoolPulse`` every PULSE_PERIOD_S between control periods (controller/panic.py reacts to it)."""
    last = time.monotonic()
    while True:
        still_wanted()
        await asyncio.sleep(PULSE_PERIOD_S)
        now = time.monotonic()
        elapsed, last = now - last, now
        pulse = stats.pulse(time.time(), elapsed, queue_length=pool.dispatcher.n_waiting, ready=pool.ready,
                            starting=pool.starting)
        with contextlib.suppress(Exception):  # broker blip: the next pulse goes out
            await nc.publish(subject, encode(pulse))


async def send_telemetry(nc: Client, subject: str, stats: PoolStats, pool: WorkerPool, period: float) -> None:
    """One ``PoolTelemetry`` per period (a dedicated pool's control period) on its telemetry subject."""
    last = time.monotonic()
    next_at = last + period
    while True:
        still_wanted()
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += period
        now = time.monotonic()
        elapsed, last = now - last, now
        dispatcher = pool.dispatcher
        sample = stats.sample(time.time(), elapsed, queue_length=dispatcher.n_waiting,
                              in_service=dispatcher.n_running, ready=pool.ready, starting=pool.starting,
                              stopping=pool.stopping)
        with contextlib.suppress(Exception):  # broker blip: the next period's sample goes out
            await nc.publish(subject, encode(sample))
