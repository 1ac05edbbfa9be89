"""``FarmBackend`` on a live pool over NATS: ``apply`` publishes a scale command, ``advance`` waits
for the next telemetry; the connection runs on an event loop in a helper thread (gym is synchronous)."""

from __future__ import annotations

import asyncio
import threading

from broker.codec import decode, encode
from broker.connection import close_quietly, connect
from broker.messages import PoolTelemetry, ScaleCommand
from broker.subjects import Subjects
from controller.scenario import Scenario
from controller.simulator import EpisodeTotals


class LiveFarm:
    def __init__(self, nats_url: str, node: str, pool: str, scenario: Scenario, *, prefix: str = "faas",
                 sample_timeout_s: float | None = None) -> None:
        self.node, self.pool, self.scenario = node, pool, scenario
        self.subjects = Subjects(prefix)
        self.timeout_s = sample_timeout_s or max(10.0, 3 * scenario.step_seconds)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="live-farm", daemon=True)
        self._thread.start()
        self._samples: asyncio.Queue[PoolTelemetry] | None = None
        self._totals = TelemetryTotals()
        self.nc = self._call(self._connect(nats_url))

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout_s + 30)

    async def _connect(self, url: str):
        nc = await connect(url, f"live-env-{self.node}-{self.pool}")
        self._samples = asyncio.Queue()

        async def on_sample(msg) -> None:
            self._samples.put_nowait(decode(PoolTelemetry, msg.data))

        await nc.subscribe(self.subjects.telemetry(self.node, self.pool), cb=on_sample)
        return nc

    async def _next(self) -> PoolTelemetry:
        assert self._samples is not None
        while not self._samples.empty():  # drop stale samples: a step observes what follows it
            self._samples.get_nowait()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._samples.get()
        except TimeoutError:
            raise TimeoutError(f"no telemetry of {self.node}/{self.pool} within {self.timeout_s:g} s on "
                               f"{self.subjects.telemetry(self.node, self.pool)}: is node {self.node} running "
                               f"with pool {self.pool}?") from None

    async def _scale(self, target: int) -> None:
        command = ScaleCommand(node=self.node, pool=self.pool, target_workers=target, reason="env", policy="gym")
        await self.nc.publish(self.subjects.scale(self.node, self.pool), encode(command))

    # -- FarmBackend --------------------------------------------------------------
    def reset(self, seed: int) -> PoolTelemetry:
        """The live workload is whatever arrives (e.g. ``p2pfaas farm run``); the seed is not used."""
        self._totals = TelemetryTotals()
        self._totals.targets.append(self.scenario.workers.initial)
        self._call(self._scale(self.scenario.workers.initial))
        return self.advance(self.scenario.step_seconds)

    def apply(self, target_workers: int) -> None:
        self._totals.targets.append(target_workers)
        self._call(self._scale(target_workers))

    def advance(self, step_seconds: float) -> PoolTelemetry:
        sample = self._call(self._next())
        self._totals.add(sample)
        return sample

    def totals(self) -> EpisodeTotals:
        return self._totals.episode()

    def close(self) -> None:
        self._call(close_quietly(self.nc))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class TelemetryTotals:
    """Episode figures from live telemetry and the targets asked for (p95 from per-period p95s)."""

    def __init__(self) -> None:
        self.samples: list[PoolTelemetry] = []
        self.targets: list[int] = []

    def add(self, sample: PoolTelemetry) -> None:
        self.samples.append(sample)

    def episode(self) -> EpisodeTotals:
        s = self.samples
        billed = [x.workers_ready + x.workers_starting + x.workers_stopping for x in s]
        duration = sum(x.period_s for x in s) or 1e-9
        worker_seconds = sum(b * x.period_s for b, x in zip(billed, s))
        completed = sum(x.completed for x in s)
        changes = [b - a for a, b in zip(self.targets, self.targets[1:])]
        return EpisodeTotals(
            duration_s=duration, tasks=sum(x.arrivals for x in s), met_deadline=sum(x.met_deadline for x in s),
            qos=sum(x.met_deadline for x in s) / completed if completed else 1.0,
            unfinished=s[-1].queue_length + s[-1].in_service if s else 0,
            worker_seconds=worker_seconds, mean_workers=worker_seconds / duration,
            max_workers=max(billed, default=0), scaling_actions=sum(1 for c in changes if c),
            workers_added=sum(c for c in changes if c > 0), workers_removed=-sum(c for c in changes if c < 0),
            latency_mean_s=(sum(x.latency_mean_s * x.completed for x in s) / completed) if completed else 0.0,
            latency_p95_s=max((x.latency_p95_s for x in s), default=0.0),
        )
