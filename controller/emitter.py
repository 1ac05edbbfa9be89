"""The farm emitter behind ``p2pfaas farm run``: a scenario's tasks (``sleep`` calls with their
deadline header) sent in real time, QoS measured end to end; ``PoolMeter`` records what the pool spent."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from nats.aio.client import Client

from broker import headers as H
from broker.client import Answer, FaasClient
from broker.codec import decode
from broker.errors import BrokerUnavailable, ContractError
from broker.lifecycle import still_wanted
from broker.messages import PoolTelemetry, ScaleCommand
from broker.subjects import Subjects
from controller.live_env import TelemetryTotals
from controller.scenario import Scenario
from controller.simulator import EpisodeTotals

log = logging.getLogger(__name__)

SUBMIT_PATIENCE_S = 6.0   # a store JetStream did not acknowledge (a leader election) is tried again this long
LOOKUPS_AT_ONCE = 16      # unanswered tasks looked up in the streams at a time (a stalled pool leaves thousands)
REFUSALS_SAID = 3         # tasks not submitted that are logged one by one (the rest are counted in errors)


@dataclass
class EmitterReport:
    """A task unanswered by the end (last arrival + ``grace_s``) is *unfinished* if the node's intake
    still holds it, else *lost*; an answer found only in the store is completed, its deadline missed."""

    submitted: int = 0
    completed: int = 0
    met_deadline: int = 0
    errors: int = 0
    lost: int = 0
    unfinished: int = 0
    interrupted: bool = False       # stopped before the end (Ctrl-C): tasks in flight are not counted
    stopped_because: str = ""       # why the emitter itself stopped the run (the broker gone)
    latencies: list[float] = field(default_factory=list)

    @property
    def settled(self) -> int:
        """Tasks whose fate is known (not those in flight at a Ctrl-C)."""
        return self.completed + self.errors + self.unfinished + self.lost

    @property
    def qos(self) -> float:
        """Deadlines met out of the tasks settled (an error, an unfinished or a lost task misses)."""
        return self.met_deadline / self.settled if self.settled else 1.0

    @property
    def p95_s(self) -> float:
        return float(np.percentile(self.latencies, 95)) if self.latencies else 0.0


@dataclass
class FarmEmitter:
    nc: Client
    node: str
    scenario: Scenario
    seed: int = 0
    prefix: str = "faas"
    fn: str = "sleep"
    speed: float = 1.0             # >1 compresses time (rates x speed, service / speed)
    grace_s: float = 60.0          # wait this long after the last arrival for stragglers
    broker_patience_s: float = 30.0   # the broker unreachable this long stops the run (the stack stopped)
    report: EmitterReport = field(default_factory=EmitterReport)   # so far (also after a Ctrl-C)

    async def run(self, progress: Callable[[float, EmitterReport], None] | None = None) -> EmitterReport:
        rng = np.random.default_rng(self.seed)
        horizon = self.scenario.episode_seconds
        arrivals, service = self.scenario.sample_tasks(rng, horizon)
        arrivals, service = arrivals / self.speed, service / self.speed
        deadlines = self.scenario.deadline.for_service(service * self.speed) / self.speed
        report = self.report = EmitterReport()
        run_id = uuid.uuid4().hex[:8]
        client = f"farm-{run_id}"
        pending: set[asyncio.Task] = set()
        lookups = asyncio.Semaphore(LOOKUPS_AT_ONCE)
        refused = 0
        async with FaasClient(self.nc, client=client, prefix=self.prefix) as faas:
            start = time.monotonic()
            # one end for every task, so that one stuck task does not keep the run going a horizon longer
            end = asyncio.get_running_loop().time() + horizon / self.speed + self.grace_s

            async def one(i: int) -> None:
                req = f"t{i}"
                sent = time.monotonic()
                fut = faas.expect(req)
                try:
                    await faas.submit(self.node, self.fn, f"{service[i]:.4f}".encode(), req,
                                      {H.DEADLINE: f"{deadlines[i]:.4f}"}, retry_for_s=SUBMIT_PATIENCE_S)
                except Exception as exc:   # not stored (JetStream away, no permission): refused, said, counted
                    nonlocal refused
                    refused += 1
                    if refused <= REFUSALS_SAID:   # a stack gone refuses every task: not a line each
                        log.warning("farm emitter: task %s not submitted: %s: %s%s", req, type(exc).__name__, exc,
                                    "; further refusals are only counted (errors)" if refused == REFUSALS_SAID else "")
                    report.errors += 1
                    faas.forget(req)
                    return
                try:
                    async with asyncio.timeout_at(end):
                        answer: Answer = await fut
                except asyncio.TimeoutError:
                    await self._unanswered(faas, client, req, report, lookups)
                    return
                finally:
                    faas.forget(req)
                latency = time.monotonic() - sent
                if answer.status != 200:
                    report.errors += 1
                    return
                report.completed += 1
                report.latencies.append(latency)
                if latency <= deadlines[i]:
                    report.met_deadline += 1

            run = asyncio.current_task()
            watch = asyncio.create_task(self._watch_broker(run, report), name="farm-emitter-broker")
            try:
                for i, at in enumerate(arrivals):
                    delay = start + at - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    report.submitted += 1
                    task = asyncio.create_task(one(i))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    if progress:
                        progress(min(1.0, at / (horizon / self.speed)), report)
                await asyncio.gather(*pending)
            except asyncio.CancelledError:   # Ctrl-C, or the broker gone: the tasks in flight stop waiting
                report.interrupted = True
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                if not (report.stopped_because and run is not None and run.uncancel() == 0):
                    raise                    # not (only) our own stop
            finally:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
        return report

    async def _watch_broker(self, run: asyncio.Task | None, report: EmitterReport) -> None:
        """Stop the run once the broker has been unreachable for ``broker_patience_s``."""
        loop = asyncio.get_running_loop()
        down_since: float | None = None
        while True:
            still_wanted()
            await asyncio.sleep(0.25)
            if self.nc.is_connected:
                down_since = None
                continue
            down_since = down_since if down_since is not None else loop.time()
            if loop.time() - down_since >= self.broker_patience_s and run is not None:
                report.stopped_because = (f"the broker has been unreachable for {self.broker_patience_s:g} s "
                                          "(the stack stopped?)")
                log.error("farm emitter: %s: the run stops; start the stack again and rerun", report.stopped_because)
                run.cancel()
                return

    @staticmethod
    async def _unanswered(faas: FaasClient, client: str, req: str, report: EmitterReport,
                          lookups: asyncio.Semaphore) -> None:
        """No answer by the end: answered after all (stored), still in the intake, or lost."""
        try:
            async with lookups:
                answer = await faas.stored_answer(client, req)
                queued = answer is None and await faas.stored_call(client, req)
            if answer is not None:
                report.completed += answer.status == 200
                report.errors += answer.status != 200
            elif queued:
                report.unfinished += 1
            else:
                report.lost += 1
        except BrokerUnavailable as exc:   # the broker is away: where the task is cannot be known
            if not report.lost:   # once, not for each of a thousand tasks
                log.warning("farm emitter: task %s unanswered, and where it is cannot be read (counted lost, "
                            "like the next ones): %s", req, exc)
            report.lost += 1


# What `farm run` reports of the pool: what it spent. The tasks' figures are the emitter's: the
# telemetry has only per-period p95s and the queue at the last sample.
POOL_FIGURES = frozenset({"duration_s", "worker_seconds", "mean_workers", "max_workers", "scaling_actions",
                          "workers_added", "workers_removed"})


class PoolMeter:
    """Worker-seconds and scaling of a pool from its telemetry and scale commands, inside ``async with``."""

    def __init__(self, nc: Client, node: str, pool: str, prefix: str = "faas") -> None:
        self.nc, self.node, self.pool = nc, node, pool
        self.subjects = Subjects(prefix)
        self.recorded = TelemetryTotals()
        self.policies: dict[str, int] = {}      # "<policy> <model version>" -> commands
        self._subs: list = []

    async def __aenter__(self) -> "PoolMeter":
        self._subs = [await self.nc.subscribe(self.subjects.telemetry(self.node, self.pool), cb=self._on_sample),
                      await self.nc.subscribe(self.subjects.scale(self.node, self.pool), cb=self._on_command)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for sub in self._subs:
            await sub.unsubscribe()

    async def _on_sample(self, msg) -> None:
        try:
            self.recorded.add(decode(PoolTelemetry, msg.data))
        except ContractError:
            return

    async def _on_command(self, msg) -> None:
        try:
            command = decode(ScaleCommand, msg.data)
        except ContractError:
            return
        recorded = self.recorded
        if not recorded.targets and recorded.samples:   # the first command changes the pool from its size then
            last = recorded.samples[-1]
            recorded.targets.append(last.workers_ready + last.workers_starting)
        recorded.targets.append(command.target_workers)
        key = f"{command.policy or '?'} {command.model_version}".strip()
        self.policies[key] = self.policies.get(key, 0) + 1

    def totals(self) -> EpisodeTotals | None:
        return self.recorded.episode() if self.recorded.samples else None
