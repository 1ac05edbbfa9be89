"""Seeded discrete-event simulator of a task farm (one FIFO queue, one task per worker) emitting the
live pools' ``PoolTelemetry``. An episode's tasks come from the seed's own stream, delays from a
second one, so every policy faces the same tasks. A removed worker takes starting ones first, then
idle, then the busy one finishing soonest (it finishes its task); it is billed until gone."""

from __future__ import annotations

import hashlib
import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict

from broker.messages import PoolPulse, PoolTelemetry
from controller.distributions import sample_delay
from controller.scenario import Scenario

Reaction = Callable[[PoolPulse, int], "int | None"]   # (pulse, current target) -> a raised target, or None

_READY, _DONE, _GONE = 0, 1, 2
_STARTING, _IDLE, _BUSY, _STOPPING = "starting", "idle", "busy", "stopping"


@dataclass(slots=True)
class _Worker:
    state: str
    draining: bool = False
    task: int = -1


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile (0.0 for no values); exact for unfinishable (inf) tasks too."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[math.ceil(0.95 * len(ordered)) - 1])


class EpisodeTotals(BaseModel):
    """End-of-episode figures; pending tasks are projected to finish on the workers left (FIFO, no
    more scaling), so ``qos`` covers every task that arrived."""

    model_config = ConfigDict(frozen=True)

    duration_s: float
    tasks: int
    met_deadline: int
    qos: float
    unfinished: int            # tasks queued or in service when the episode ended
    worker_seconds: float
    mean_workers: float        # worker_seconds / duration_s
    max_workers: int           # most workers billed at the same time
    scaling_actions: int       # decisions that changed the target
    workers_added: int
    workers_removed: int
    latency_mean_s: float
    latency_p95_s: float


class FarmSimulator:
    """``reset(seed)``, then alternate ``set_target(n)`` and ``advance(seconds)``."""

    def __init__(self, scenario: Scenario, seed: int = 0, instant: bool = False) -> None:
        self.scenario = scenario
        self.instant = instant  # no cold start, no scale-down delay: the oracle's farm
        self.reset(seed)

    # ------------------------------------------------------------------ control
    def reset(self, seed: int) -> None:
        sc = self.scenario
        workload, infra = np.random.SeedSequence(seed).spawn(2)
        wl = np.random.default_rng(workload)
        self._delays = np.random.default_rng(infra)
        arrivals, service = sc.sample_tasks(wl, sc.duration_s)
        self._arrival = arrivals.tolist()
        self._service = service.tolist()
        self._deadline = sc.deadline.for_service(service).tolist()
        self._next_arrival = 0
        self._tick_arrivals = 0
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._workers: list[_Worker] = []
        self._idle: list[int] = []
        self._queue: deque[int] = deque()
        self._starting = self._ready = self._stopping = self._in_service = 0
        self._alive = 0
        self._area_t = 0.0
        self.worker_seconds = 0.0
        self.max_workers = 0
        self.scaling_actions = self.workers_added = self.workers_removed = 0
        self._latencies: list[float] = []
        self._met_total = 0
        self._window_reset()
        for _ in range(sc.workers.initial):
            self._workers.append(_Worker(_IDLE))
            self._idle.append(len(self._workers) - 1)
            self._ready += 1
            self._alive += 1
        self.max_workers = self._alive

    @property
    def target(self) -> int:
        """Workers requested and not being removed (ready + starting)."""
        return self._ready + self._starting

    def set_target(self, workers: int) -> int:
        """Scale toward ``workers`` (clamped to the scenario bounds); returns the target applied."""
        bounds = self.scenario.workers
        workers = max(bounds.min, min(bounds.max, int(workers)))
        delta = workers - self.target
        if delta == 0:
            return workers
        self.scaling_actions += 1
        self._account(self.now)
        if delta > 0:
            for _ in range(delta):
                self._add_worker()
        else:
            for _ in range(-delta):
                self._remove_worker()
        return workers

    def advance(self, seconds: float, react: Reaction | None = None, tick_s: float = 2.0) -> PoolTelemetry:
        """The telemetry of ``seconds`` more; ``react`` (the panic rule) sees a pulse every ``tick_s``."""
        start, end = self.now, self.now + seconds
        if react is not None:
            self._tick_arrivals = 0   # the first pulse's window starts with the period
            tick = start + tick_s
            while tick < end - 1e-9:
                self._run_until(tick)
                self.now = tick
                self._account(tick)
                raised = react(self._pulse(tick_s), self.target)
                if raised is not None:
                    self.set_target(raised)
                tick += tick_s
        self._run_until(end)
        self.now = end
        self._account(end)
        return self._telemetry(start, seconds)

    def _pulse(self, window_s: float) -> PoolPulse:
        pulse = PoolPulse(node="sim", pool="sim", time=self.now, window_s=window_s, arrivals=self._tick_arrivals,
                          queue_length=len(self._queue), workers_ready=self._ready, workers_starting=self._starting)
        self._tick_arrivals = 0
        return pulse

    def _run_until(self, end: float) -> None:
        arrival, heap = self._arrival, self._heap
        n_arrivals = len(arrival)
        while True:
            next_arrival = arrival[self._next_arrival] if self._next_arrival < n_arrivals else float("inf")
            next_event = heap[0][0] if heap else float("inf")
            if min(next_arrival, next_event) > end:
                break
            if next_event <= next_arrival:  # a freed worker takes a simultaneous arrival
                t, _, kind, w = heapq.heappop(heap)
                self._event(t, kind, w)
            else:
                self._arrive(next_arrival)

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, worker: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, worker))

    def _arrive(self, t: float) -> None:
        task = self._next_arrival
        self._next_arrival += 1
        self._w_arrivals += 1
        self._tick_arrivals += 1
        if self._idle:
            self._start(self._idle.pop(), task, t)
        else:
            self._queue.append(task)

    def _start(self, w: int, task: int, t: float) -> None:
        worker = self._workers[w]
        worker.state, worker.task = _BUSY, task
        self._in_service += 1
        self._push(t + self._service[task], _DONE, w)

    def _event(self, t: float, kind: int, w: int) -> None:
        worker = self._workers[w]
        if kind == _READY:
            if worker.state != _STARTING:  # cancelled while starting
                return
            self._starting -= 1
            self._ready += 1
            self._free(w, t)
        elif kind == _DONE:
            task = worker.task
            latency = t - self._arrival[task]
            self._in_service -= 1
            self._latencies.append(latency)
            self._w_latencies.append(latency)
            if latency <= self._deadline[task] + 1e-9:
                self._met_total += 1
                self._w_met += 1
            worker.task = -1
            if worker.draining:
                worker.state = _STOPPING
                self._push(t + self._delay(self.scenario.scale_down_seconds), _GONE, w)
            else:
                self._free(w, t)
        else:  # _GONE
            self._account(t)
            self._stopping -= 1
            self._alive -= 1
            worker.state = "gone"

    def _free(self, w: int, t: float) -> None:
        if self._queue:
            self._start(w, self._queue.popleft(), t)
        else:
            self._workers[w].state = _IDLE
            self._idle.append(w)

    def _add_worker(self) -> None:
        self._workers.append(_Worker(_STARTING))
        self._starting += 1
        self._alive += 1
        self.workers_added += 1
        self.max_workers = max(self.max_workers, self._alive)
        self._push(self.now + self._delay(self.scenario.cold_start_seconds), _READY, len(self._workers) - 1)

    def _remove_worker(self) -> None:
        self.workers_removed += 1
        starting = [i for i, wk in enumerate(self._workers) if wk.state == _STARTING]
        if starting:
            w = starting[-1]  # the most recently requested is the furthest from ready
            self._starting -= 1
        elif self._idle:
            w = self._idle.pop()
            self._ready -= 1
        else:
            busy = {w for _, _, kind, w in self._heap if kind == _DONE and not self._workers[w].draining}
            w = min(busy, key=lambda i: self._done_time(i))
            self._workers[w].draining = True
            self._ready -= 1
            self._stopping += 1
            return
        self._workers[w].state = _STOPPING
        self._stopping += 1
        self._push(self.now + self._delay(self.scenario.scale_down_seconds), _GONE, w)

    def _delay(self, delay) -> float:
        # drawn in instant mode too, so the delay stream stays aligned with the normal farm's
        value = sample_delay(delay, self._delays)
        return 0.0 if self.instant else value

    def _done_time(self, w: int) -> float:
        return min(t for t, _, kind, i in self._heap if kind == _DONE and i == w)

    def _account(self, t: float) -> None:
        self.worker_seconds += self._alive * (t - self._area_t)
        self._area_t = t

    # ------------------------------------------------------------------ reporting
    def _window_reset(self) -> None:
        self._w_arrivals = 0
        self._w_met = 0
        self._w_latencies: list[float] = []

    def _telemetry(self, start: float, period: float) -> PoolTelemetry:
        lat = self._w_latencies
        completed = len(lat)
        telemetry = PoolTelemetry(
            node="sim",
            pool="sim",
            time=self.now,
            period_s=period,
            queue_length=len(self._queue),
            in_service=self._in_service,
            workers_ready=self._ready,
            workers_starting=self._starting,
            workers_stopping=self._stopping,
            arrivals=self._w_arrivals,
            completed=completed,
            met_deadline=self._w_met,
            arrival_rate=self._w_arrivals / period if period > 0 else 0.0,
            throughput=completed / period if period > 0 else 0.0,
            latency_mean_s=sum(lat) / completed if completed else 0.0,
            latency_p95_s=p95(lat),
            latency_max_s=max(lat) if completed else 0.0,
            qos=self._w_met / completed if completed else 1.0,
        )
        self._window_reset()
        return telemetry

    def pending(self) -> int:
        return len(self._queue) + self._in_service

    def workload_fingerprint(self) -> str:
        """A short hash of the episode's tasks (arrivals, service times, deadlines)."""
        digest = hashlib.sha1()
        for values in (self._arrival, self._service, self._deadline):
            digest.update(np.asarray(values, dtype=np.float64).tobytes())
        return digest.hexdigest()[:16]

    def tasks_arrived(self) -> int:
        return self._next_arrival

    def tasks_completed(self) -> int:
        return len(self._latencies)

    def totals(self) -> EpisodeTotals:
        """Episode figures up to now (the state is left untouched)."""
        latencies, met = list(self._latencies), self._met_total
        for task, finish in self._project_pending():
            latency = finish - self._arrival[task]
            latencies.append(latency)
            met += latency <= self._deadline[task] + 1e-9
        tasks = self._next_arrival
        duration = self.now
        return EpisodeTotals(
            duration_s=duration,
            tasks=tasks,
            met_deadline=met,
            qos=met / tasks if tasks else 1.0,
            unfinished=self.pending(),
            worker_seconds=self.worker_seconds,
            mean_workers=self.worker_seconds / duration if duration > 0 else float(self._alive),
            max_workers=self.max_workers,
            scaling_actions=self.scaling_actions,
            workers_added=self.workers_added,
            workers_removed=self.workers_removed,
            latency_mean_s=float(np.mean(latencies)) if latencies else 0.0,
            latency_p95_s=p95(latencies),
        )

    def _project_pending(self) -> list[tuple[int, float]]:
        """(task, finish time) of every pending task if the farm ran on without scaling."""
        out: list[tuple[int, float]] = []
        free: list[float] = []  # when each non-draining worker can take a queued task
        ready_at = {w: t for t, _, kind, w in self._heap if kind == _READY}
        for t, _, kind, w in self._heap:
            if kind == _DONE:
                out.append((self._workers[w].task, t))
                if not self._workers[w].draining:
                    free.append(t)
        for w, worker in enumerate(self._workers):
            if worker.state == _IDLE:
                free.append(self.now)
            elif worker.state == _STARTING:
                free.append(ready_at[w])
        if not free:
            return out + [(task, float("inf")) for task in self._queue]
        heapq.heapify(free)
        for task in self._queue:
            t = heapq.heappop(free)
            finish = t + self._service[task]
            out.append((task, finish))
            heapq.heappush(free, finish)
        return out
