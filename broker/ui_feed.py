"""The live feed behind ``/ui``: heartbeats, telemetry, scale decisions, learner activity, kept a few minutes
and sent to every open page as ``{"type", "at", "data"}`` events (docs/dashboard.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import BaseModel

from broker.codec import decode
from broker.errors import ContractError, InvalidSubject, InvalidToken
from broker.messages import (Heartbeat, LearnerWeights, PoolTelemetry, ScaleCommand, ScalingExperience,
                             SchedulerConfiguration, SchedulingExperience)
from broker.subjects import Subjects
from broker.lifecycle import still_wanted

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

SUSPECT_AFTER = 3         # silent heartbeat periods before a node shows as suspected (discovery's default)
GONE_AFTER = 10           # ... and as gone (discovery removes it then)
FORWARD_WINDOW_S = 60.0   # the forward graph sums this much
SCHEDULER_REFRESH_S = 15.0   # how often a node is asked for its scheduler when its heartbeats do not carry it


@dataclass
class NodeTrack:
    """A node as the dashboard sees it: its newest heartbeat and how regularly heartbeats come."""

    heartbeat: Heartbeat
    seen_at: float                      # our clock, when the newest heartbeat arrived
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=11))
    scheduler: str = ""
    asked_at: float = float("-inf")     # when we last asked for its scheduler

    def observe(self, heartbeat: Heartbeat, now: float) -> None:
        self.gaps.append(now - self.seen_at)
        self.heartbeat, self.seen_at = heartbeat, now
        if heartbeat.scheduler:
            self.scheduler = heartbeat.scheduler

    @property
    def period_s(self) -> float:
        """The median gap (a newcomer's extra heartbeat does not shorten it); 1 s until two were seen."""
        return max(0.05, statistics.median(self.gaps)) if self.gaps else 1.0

    def status(self, now: float) -> str:
        silent = now - self.seen_at
        if silent > GONE_AFTER * self.period_s:
            return "gone"
        return "suspected" if silent > SUSPECT_AFTER * self.period_s else "alive"


class ForwardWindow:
    """Forwards between nodes over the last minute, summed from the per-period counts in heartbeats."""

    def __init__(self, window_s: float = FORWARD_WINDOW_S) -> None:
        self.window_s = window_s
        self.reported = False            # did any heartbeat carry counts at all?
        self._counts: deque[tuple[float, str, str, int]] = deque()

    def add(self, source: str, forwards: dict[str, int] | None, at: float) -> None:
        if forwards is None:
            return
        self.reported = True
        self._counts.extend((at, source, peer, n) for peer, n in sorted(forwards.items()) if n > 0)

    def totals(self, now: float) -> dict[str, dict[str, int]]:
        while self._counts and self._counts[0][0] < now - self.window_s:
            self._counts.popleft()
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for _, source, peer, n in self._counts:
            out[source][peer] += n
        return {source: dict(peers) for source, peers in out.items()}


class LearningCounts:
    """Experiences since the last tick: scheduling rewards per node, scaling experiences per pool."""

    def __init__(self) -> None:
        self._rewards: dict[str, list[float]] = {}
        self._experiences: dict[str, list[float]] = {}

    def reward(self, node: str, reward: float) -> None:
        self._add(self._rewards, node, reward)

    def experience(self, node: str, pool: str, reward: float) -> None:
        self._add(self._experiences, f"{node}/{pool}", reward)

    def take(self) -> dict[str, dict[str, dict[str, float]]]:
        """{"rewards": {node: {count, reward_sum}}, "experiences": {"node/pool": {...}}}; starts over."""
        out = {name: {key: {"count": int(c), "reward_sum": s} for key, (c, s) in counts.items()}
               for name, counts in (("rewards", self._rewards), ("experiences", self._experiences))}
        self._rewards, self._experiences = {}, {}
        return out

    @staticmethod
    def _add(counts: dict[str, list[float]], key: str, reward: float) -> None:
        entry = counts.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += reward


class FeedClient:
    """One open page's bounded queue of events; a page too slow gets None: it should reconnect."""

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(size)
        self.lagged = False

    def offer(self, text: str) -> None:
        if self.lagged:
            return
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            self.lagged = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)

    async def next(self) -> str | None:
        return await self.queue.get()


class DashboardFeed:
    """Subscribes while at least one page is attached; keeps ``history_s`` of events for new pages."""

    def __init__(self, nc: Client, subjects: Subjects, *, history_s: float = 600.0, max_events: int = 50_000,
                 tick_s: float = 1.0, client_buffer: int = 5_000, request_timeout_s: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.nc, self.subjects = nc, subjects
        self.history_s, self.tick_s = history_s, tick_s
        self.client_buffer, self.request_timeout_s = client_buffer, request_timeout_s
        self.clock = clock
        self.history: deque[tuple[float, str]] = deque(maxlen=max_events)
        self.nodes: dict[str, NodeTrack] = {}
        # (node, pool) -> its telemetry's last time; -> its newest scale target and when (kept history_s)
        self.pools: dict[tuple[str, str], float] = {}
        self.targets: dict[tuple[str, str], tuple[int, float]] = {}
        self.forwards = ForwardWindow()
        self.learning = LearningCounts()
        self.malformed = 0
        self.clients: set[FeedClient] = set()
        self._subs: list = []
        self._tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()

    # -- pages --------------------------------------------------------------------
    async def attach(self) -> tuple[list[str], FeedClient]:
        """A new page: the events of the last ``history_s`` seconds, and its queue of live ones."""
        async with self._lock:
            if not self.clients:
                await self._start()
            client = FeedClient(self.client_buffer)
            self.clients.add(client)
            self._prune(self.clock())
            return [text for _, text in self.history], client

    async def detach(self, client: FeedClient) -> None:
        async with self._lock:
            self.clients.discard(client)
            if not self.clients:
                await self._stop()

    async def close(self) -> None:
        async with self._lock:
            self.clients.clear()
            await self._stop()

    def note_scheduler(self, node: str, scheduler: str) -> None:
        """A scheduler change the dashboard made itself: shown at once, not at the next refresh."""
        if node in self.nodes:
            self.nodes[node].scheduler = scheduler

    # -- subscriptions ----------------------------------------------------------------
    async def _start(self) -> None:
        s = self.subjects
        for subject, handler in ((s.all_membership(), self._on_heartbeat), (s.all_telemetry(), self._on_telemetry),
                                 (s.all_scale(), self._on_scale), (s.all_rewards(), self._on_reward),
                                 (s.all_scaling_experiences(), self._on_experience),
                                 (s.all_learner_weights(), self._on_weights)):
            self._subs.append(await self.nc.subscribe(subject, cb=handler))
        self._spawn(self._tick_forever())

    async def _stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):  # the connection may already be closed at shutdown
                await sub.unsubscribe()
        self._subs.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _decode(self, contract: type[M], msg: Msg) -> M | None:
        try:
            return decode(contract, msg.data)
        except ContractError as exc:
            self.malformed += 1
            log.debug("dashboard: %s on %s ignored: %s", contract.__name__, msg.subject, exc)
            return None

    async def _on_heartbeat(self, msg: Msg) -> None:
        hb = self._decode(Heartbeat, msg)
        if hb is None:
            return
        now = self.clock()
        track = self.nodes.get(hb.node)
        if track is None:
            self.nodes[hb.node] = NodeTrack(hb, now, scheduler=hb.scheduler)
        elif hb.time <= track.heartbeat.time:
            return  # replayed or reordered: never refreshes a node (as discovery)
        else:
            track.observe(hb, now)
        self.forwards.add(hb.node, hb.forwards, now)
        self._publish("heartbeat", now, hb.model_dump(mode="json"))

    async def _on_telemetry(self, msg: Msg) -> None:
        sample = self._decode(PoolTelemetry, msg)
        if sample is not None:
            now = self.clock()
            self.pools[(sample.node, sample.pool)] = now
            self._publish("telemetry", now, sample.model_dump(mode="json"))

    async def _on_scale(self, msg: Msg) -> None:
        command = self._decode(ScaleCommand, msg)
        if command is None:
            return
        key, now = (command.node, command.pool), self.clock()
        previous = self.targets.get(key, (None,))[0]
        self.targets[key] = (command.target_workers, now)
        self._publish("scale", now, {**command.model_dump(mode="json"), "previous": previous})

    async def _on_reward(self, msg: Msg) -> None:
        sample = self._decode(SchedulingExperience, msg)
        if sample is None:
            return
        try:
            node, _ = self.subjects.parse_experience(msg.subject)
        except (InvalidSubject, InvalidToken):
            self.malformed += 1
            return
        self.learning.reward(node, sample.reward)

    async def _on_experience(self, msg: Msg) -> None:
        sample = self._decode(ScalingExperience, msg)
        if sample is not None:
            self.learning.experience(sample.node, sample.pool, sample.reward)

    async def _on_weights(self, msg: Msg) -> None:
        weights = self._decode(LearnerWeights, msg)
        if weights is not None:  # the version is training progress; the weights themselves stay here
            self._publish("weights", self.clock(), weights.model_dump(
                mode="json", include={"node", "model", "algorithm", "version", "at"}))

    # -- once a second --------------------------------------------------------------------
    async def _tick_forever(self) -> None:
        while True:
            still_wanted()
            await asyncio.sleep(self.tick_s)
            now = self.clock()
            self._prune(now)
            self._publish("tick", now, self.tick(now))
            self._ask_schedulers(now)

    def tick(self, now: float) -> dict[str, Any]:
        """Node status (alive/suspected/gone), the forward graph and the learning counts since the last tick."""
        return {
            "nodes": {node: {"status": t.status(now), "silent_s": round(now - t.seen_at, 3),
                             "period_s": round(t.period_s, 3), "scheduler": t.scheduler}
                      for node, t in sorted(self.nodes.items())},
            "forwards": self.forwards.totals(now) if self.forwards.reported else None,
            "learning": self.learning.take(),
            "malformed": self.malformed,
        }

    def _prune(self, now: float) -> None:
        while self.history and self.history[0][0] < now - self.history_s:
            self.history.popleft()
        for node in [n for n, t in self.nodes.items() if now - t.seen_at > self.history_s]:
            del self.nodes[node]
        for pool in [p for p, seen_at in self.pools.items() if now - seen_at > self.history_s]:
            del self.pools[pool]
        for pool in [p for p, (_, seen_at) in self.targets.items() if now - seen_at > self.history_s]:
            del self.targets[pool]

    def _publish(self, kind: str, at: float, data: dict[str, Any]) -> None:
        text = orjson.dumps({"type": kind, "at": at, "data": data}).decode()
        self.history.append((at, text))
        for client in list(self.clients):
            client.offer(text)

    def _ask_schedulers(self, now: float) -> None:
        """Heartbeats of older nodes do not say which scheduler runs: ask those nodes now and then."""
        for node, track in self.nodes.items():
            if not track.heartbeat.scheduler and now - track.asked_at > SCHEDULER_REFRESH_S:
                track.asked_at = now
                self._spawn(self._ask_scheduler(node))

    async def _ask_scheduler(self, node: str) -> None:
        try:
            msg = await self.nc.request(self.subjects.scheduler_config(node, "get"), b"",
                                        timeout=self.request_timeout_s)
            self.note_scheduler(node, decode(SchedulerConfiguration, msg.data).describe())
        except Exception as exc:  # no answer, or an answer we cannot read: ask again later
            log.debug("dashboard: scheduler of %s unknown: %s", node, exc)
