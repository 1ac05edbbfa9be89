"""P2PFaaS ``LearningScheduler [numTaskTypes, maxPeers, explore, peerLoads]``: the node's learner
picks the action for the state; the node rewards it later (docs/learning.md). Actions: 0 reject,
1 run here, 2 probe one random peer and forward if less loaded, >= 3 forward to peer ``action - 3``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import random
import time
from collections import deque
from typing import Callable, Collection, Sequence

from nats.aio.client import Client

from broker import headers as H
from broker.codec import decode
from broker.errors import ContractError
from broker.messages import Heartbeat, LearnerAction, LearningDecision
from broker.subjects import DEFAULT_GROUP, Subjects
from nodes.discovery.membership import MembershipView
from nodes.learner.client import LearnerError, LocalPolicy, RemotePolicy
from nodes.scheduler.base import (
    Decision,
    Execute,
    Forward,
    Reject,
    SchedulingAlgorithm,
    SchedulingRequest,
    SchedulingView,
    parse_bool,
)
from nodes.scheduler.forward import forwardable_peers, parse_uint, run_locally
from nodes.scheduler.rewards import RewardTracker

__all__ = ["LearningContext", "LearningScheduler", "count_by_type", "encode_state", "encode_room_state",
           "room_bucket", "task_type_index"]

log = logging.getLogger(__name__)

REJECT, LOCAL, PROBE_AND_FORWARD, FIRST_PEER = 0, 1, 2, 3
ROOM_BUCKETS = 3   # free slots as 0, 1, 2+: what a decision needs, few states to learn
TaskKeys = Callable[[], tuple[Collection[str], Collection[str]]]   # (running, enqueued and not done)


def raw_task_type(task_type: float | None) -> int:
    """``X-P2pfaas-Scheduler-Learning-Task-Type`` as an integer; missing or invalid is type 0."""
    if task_type is None or not math.isfinite(task_type) or task_type < 0:
        return 0
    return int(task_type)


def task_type_index(task_type: float | None, n_types: int) -> int:
    """The type's index in the state: 0..n_types-1 (a type beyond the range counts as the last)."""
    return min(raw_task_type(task_type), n_types - 1)


def count_by_type(types: dict[str, int], running: Collection[str], outstanding: Collection[str],
                  n_types: int) -> tuple[list[int], list[int]]:
    """Running and queued tasks per type; a task of unknown type counts as type 0."""
    run, queue = [0] * n_types, [0] * n_types
    for key in outstanding:
        t = min(types.get(key, 0), n_types - 1)
        if key in running:
            run[t] += 1
        else:
            queue[t] += 1
    for key in running:
        if key not in outstanding:  # left in the stream by a previous run of the node
            run[min(types.get(key, 0), n_types - 1)] += 1
    return run, queue


def encode_state(task_type: int, running: Sequence[int], queued: Sequence[int]) -> list[float]:
    """P2PFaaS's state: [task type, running of type 0..N-1, queued of type 0..N-1]."""
    return [float(task_type), *map(float, running), *map(float, queued)]


def room_bucket(free: int | None) -> int:
    """Free slots as a state value: 0 (none, or unknown), 1, or 2 for two and more."""
    return 0 if free is None else max(0, min(int(free), ROOM_BUCKETS - 1))


def encode_room_state(task_type: int, local_free: int, peers_free: Sequence[int | None]) -> list[float]:
    """The peer-aware state: [task type, free slots here, free slots of each peer], bucketed."""
    return [float(task_type), float(room_bucket(local_free)), *(float(room_bucket(f)) for f in peers_free)]


class PeerLoads:
    """Peers' loads from their heartbeats, corrected for our forwards to them since the newest one."""

    COUNTED = 1024   # a node has at most 1024 slots (NodeConfiguration): more forwards change nothing

    def __init__(self, node: str, period_s: float = 1.0, clock: Callable[[], float] = time.time) -> None:
        self.view = MembershipView(node, period_s=period_s)
        self.clock = clock
        self._forwards: dict[str, deque[float]] = {}   # times of our forwards since the peer's newest heartbeat

    def observe(self, heartbeat: Heartbeat) -> None:
        self.view.observe(heartbeat, self.clock())

    def forwarded(self, peer: str) -> None:
        """Note a forward to ``peer``: only those since its newest heartbeat are kept (at most COUNTED),
        so the list cannot grow for ever; a peer without heartbeats (a P2PFaaS machine) keeps none."""
        heartbeat = self.view.heartbeat(peer)
        if heartbeat is None:
            self._forwards.pop(peer, None)
            return
        times = self._since(peer, heartbeat.time)
        times.append(self.clock())

    def free_slots(self, peer: str, probed: int | None = None) -> int | None:
        """Free slots of ``peer``: its K minus the probed load (running + queued) if given, else its
        heartbeat's load and our forwards since; None when its K is unknown (no heartbeat)."""
        load = self.view.load(peer, self.clock())
        if load is None:
            return None
        if probed is not None:
            return max(0, load.slots - probed)
        return max(0, load.free_slots - len(self._since(peer, load.at)))

    def _since(self, peer: str, at: float) -> deque[float]:
        times = self._forwards.get(peer)
        if times is None:
            times = self._forwards[peer] = deque(maxlen=self.COUNTED)
        while times and times[0] <= at:
            times.popleft()
        return times


class LearningContext:
    """What a LearningScheduler needs from its node (policies, task types, EIDs, deadlines, rewards);
    the scheduler service offers it to algorithms as ``view.learning``."""

    RETRY_S = 5.0  # after the learner did not answer, act without it this long before asking again

    def __init__(self, nc: Client, node: str, tasks: TaskKeys, *, prefix: str = "faas",
                 deadlines: dict[int, float] | None = None, default_deadline_s: float = 1.0,
                 timeout_s: float = 0.5, clock: Callable[[], float] = time.monotonic,
                 heartbeat_period_s: float = 1.0, node_rewards: bool = True,
                 group: Callable[[], str] = lambda: DEFAULT_GROUP) -> None:
        """``group()``: the node's group now (only its peers' heartbeats are read)."""
        self.nc, self.node, self.tasks, self.clock, self._group = nc, node, tasks, clock, group
        self.subjects = Subjects(prefix)
        self.peer_loads = PeerLoads(node, heartbeat_period_s)
        self._membership = None
        self.deadlines, self.default_deadline_s = dict(deadlines or {}), default_deadline_s
        self.local = LocalPolicy(nc, node, prefix=prefix, timeout_s=timeout_s)
        self.remote = RemotePolicy(nc, node, prefix=prefix, timeout_s=timeout_s)
        self.rewards = RewardTracker(nc, node, prefix=prefix, publish=node_rewards)
        self.types: dict[str, int] = {}       # call key -> task type, of tasks enqueued here
        self._prune_at = 1024
        # EIDs must grow across restarts (the learner links EID n to n + 1): start at the clock in µs
        self._eids = itertools.count(int(time.time() * 1e6))
        self._actions_n: int | None = None
        self._retry_at = 0.0
        self._begun = False
        self._lock = asyncio.Lock()

    @classmethod
    def for_node(cls, nc: Client, settings, tasks: TaskKeys) -> "LearningContext":
        return cls(nc, settings.node_id, tasks, prefix=settings.prefix, deadlines=settings.task_type_deadlines,
                   default_deadline_s=settings.task_deadline_s, heartbeat_period_s=settings.heartbeat_period_s,
                   node_rewards=settings.node_rewards, group=lambda: settings.group)

    async def stop(self) -> None:
        if self._membership is not None:
            try:
                await self._membership.unsubscribe()
            except Exception as exc:  # the connection may already be gone
                log.debug("learning context of %s: unsubscribe: %s", self.node, exc)
            self._membership = None
        await self.local.stop()
        await self.rewards.stop()

    def deadline_of(self, task_type: int) -> float:
        return self.deadlines.get(task_type, self.default_deadline_s)

    def next_eid(self) -> int:
        return next(self._eids)

    def counts(self, n_types: int) -> tuple[list[int], list[int]]:
        running, outstanding = self.tasks()
        return count_by_type(self.types, running, outstanding, n_types)

    # -- the learner ----------------------------------------------------------------
    async def _begin(self) -> None:
        """On the first decision, so that a node that never learns pays nothing: subscribe, start."""
        if self._begun:
            return
        async with self._lock:
            if not self._begun:
                self._membership = await self.nc.subscribe(self.subjects.all_membership(self._group()),
                                                           cb=self._on_heartbeat)
                await self.rewards.start()
                await self.local.start()
                self._begun = True

    async def _on_heartbeat(self, msg) -> None:
        try:
            self.peer_loads.observe(decode(Heartbeat, msg.data))
        except ContractError as exc:
            log.debug("learning context of %s: bad heartbeat: %s", self.node, exc)

    async def configure_actions(self, n_actions: int) -> None:
        """Size the learner's scheduling model to ``n_actions`` once (P2PFaaS's ``actions_n``)."""
        if self._actions_n == n_actions or self.clock() < self._retry_at:
            return
        try:
            if int((await self.remote.parameters()).get("actions_n", n_actions)) != n_actions:
                await self.remote.set_parameters({"actions_n": n_actions})
        except LearnerError as exc:
            if exc.status != 400:
                self._retry_at = self.clock() + self.RETRY_S
                return
            log.warning("learner of %s refuses actions_n=%d (%s): acting with its actions", self.node, n_actions, exc)
        self._actions_n = n_actions

    async def act(self, state: list[float], explore: bool) -> LearnerAction | None:
        """The learner's action (the local copy, else a round trip); None when no learner answers."""
        await self._begin()
        if self.local.ready:
            try:
                return self.local.act(state, explore)
            except Exception as exc:  # e.g. a DQN copy of another state size
                log.warning("local policy of %s cannot act on %s: %s", self.node, state, exc)
        if self.clock() < self._retry_at:
            return None
        try:
            return await self.remote.act(state, explore)
        except LearnerError as exc:
            log.warning("learner of %s did not give an action (%s); acting without it for %g s",
                        self.node, exc, self.RETRY_S)
            self._retry_at = self.clock() + self.RETRY_S
            return None

    # -- bookkeeping ----------------------------------------------------------------
    def record(self, key: str, decision: LearningDecision, task_type: int) -> None:
        self.rewards.track(key, decision, self.deadline_of(task_type))

    def annotate(self, key: str, request: SchedulingRequest, decision: Decision,
                 headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with this node's learning decision (or the origin's, for a forwarded request),
        never a client's own learning headers; notes the type of a task queued here."""
        own = self.decision_for(key, request, decision)
        if own is None and request.external:
            return headers
        clean = {k: v for k, v in headers.items() if k not in H.LEARNING}
        return {**clean, **own.headers()} if own is not None else clean

    def decision_for(self, key: str, request: SchedulingRequest, decision: Decision) -> LearningDecision | None:
        """:meth:`annotate` without the headers: this node's learning decision on ``key``, if any."""
        if isinstance(decision, Execute):
            self.types[key] = raw_task_type(request.task_type)
            if len(self.types) > self._prune_at:
                _, outstanding = self.tasks()
                self.types = {k: t for k, t in self.types.items() if k in outstanding}
                self._prune_at = 2 * len(self.types) + 1024
        return self.rewards.decision_of(key)


class LearningScheduler(SchedulingAlgorithm):
    """Decide with the node's learner (``view.learning``); forwarded requests run here.

    * ``numTaskTypes``: task types in the state (``X-P2pfaas-Scheduler-Learning-Task-Type``);
    * ``maxPeers`` (default 2): the learner's model gets ``3 + maxPeers`` actions; an action
      naming a peer the view does not have (index >= its length) runs the request here;
    * ``explore`` (default true): epsilon-greedy as the learner sets it; false acts greedily;
    * ``peerLoads`` (default true): the state holds free slots here and at the first ``maxPeers``
      peers of the view (probed when none is free here); false: P2PFaaS's state.

    Running here means loss. Without a learner the request runs here, unrecorded.
    """

    name = "LearningScheduler"
    DEFAULTS = ("1", "2", "true", "true")

    def __init__(self, num_task_types: int = 1, max_peers: int = 2, explore: bool = True, peer_loads: bool = True, *,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        if num_task_types < 1:
            raise ValueError(f"numTaskTypes must be >= 1, got {num_task_types}")
        if not 0 <= max_peers <= 1000:
            raise ValueError(f"maxPeers must be between 0 and 1000, got {max_peers}")
        self.num_task_types, self.max_peers, self.explore = num_task_types, max_peers, explore
        self.peer_loads = peer_loads
        self.rng = rng or random.Random()
        self.clock = clock
        self._warned = False

    @classmethod
    def from_parameters(cls, parameters: Sequence[str], *, rng: random.Random | None = None) -> "LearningScheduler":
        params = list(parameters)
        if len(params) > 4:
            raise ValueError(f"LearningScheduler takes [numTaskTypes, maxPeers, explore, peerLoads], got {params!r}")
        params += list(cls.DEFAULTS[len(params):])
        return cls(parse_uint(params[0], "numTaskTypes", minimum=1), parse_uint(params[1], "maxPeers"),
                   parse_bool(params[2]), parse_bool(params[3]), rng=rng)

    def parameters(self) -> list[str]:
        return [str(self.num_task_types), str(self.max_peers), str(self.explore).lower(), str(self.peer_loads).lower()]

    @property
    def n_actions(self) -> int:
        return FIRST_PEER + self.max_peers

    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        if request.external:  # P2PFaaS: a forwarded request runs here
            return run_locally(view, loss=True)
        learning = view.learning
        if not isinstance(learning, LearningContext):
            if not self._warned:
                log.warning("%s on %s has no learner context: running requests locally", self.describe(), view.node_id)
                self._warned = True
            return run_locally(view, loss=True)
        task_type = task_type_index(request.task_type, self.num_task_types)
        probing_s = 0.0
        if self.peer_loads:
            state, probing_s = await self.room_state(task_type, view, learning)
        else:
            state = encode_state(task_type, *learning.counts(self.num_task_types))
        await learning.configure_actions(self.n_actions)
        chosen = await learning.act(state, self.explore)
        if chosen is None:
            return run_locally(view, loss=True, probing_s=probing_s)
        decision = await self.carry_out(chosen.action, request, view)
        if isinstance(decision, Forward) and self.peer_loads:   # only the peer-aware state reads them
            learning.peer_loads.forwarded(decision.peer)
        if probing_s:
            decision = dataclasses.replace(decision, probing_s=decision.probing_s + probing_s)
        learning.record(f"{request.client}.{request.request_id}",
                        LearningDecision(eid=learning.next_eid(), state=state, action=chosen.action, eps=chosen.eps),
                        raw_task_type(request.task_type))  # its own deadline, even beyond numTaskTypes
        return decision

    async def room_state(self, task_type: int, view: SchedulingView,
                         learning: LearningContext) -> tuple[list[float], float]:
        """(the peer-aware state, seconds spent probing): the first ``maxPeers`` peers of the view,
        probed when no slot is free here, otherwise read from their heartbeats."""
        local = view.local_load()
        local_free = local.slots - local.running - local.queued
        peers = list(view.peers())[:self.max_peers]
        probed: list[int | None] = [None] * len(peers)
        started = self.clock()
        if local_free <= 0 and peers:
            answers = await asyncio.gather(*(view.probe(p) for p in peers), return_exceptions=True)
            # a failed probe is a fully loaded peer (K - K = 0 free), never an idle one
            probed = [a if isinstance(a, int) and not isinstance(a, bool) else 1 << 30 for a in answers]
        probing_s = self.clock() - started if local_free <= 0 and peers else 0.0
        free = [learning.peer_loads.free_slots(p, load) for p, load in zip(peers, probed)]
        free += [None] * (self.max_peers - len(peers))
        return encode_room_state(task_type, local_free, free), probing_s

    async def carry_out(self, action: int, request: SchedulingRequest, view: SchedulingView) -> Decision:
        """The decision an action stands for (never raises, whatever the action or the view)."""
        if action == REJECT:
            return Reject("LearningScheduler chose to reject (action 0)")
        if action == LOCAL:
            return run_locally(view, loss=True)
        candidates = forwardable_peers(request, view)
        if action == PROBE_AND_FORWARD:
            if not candidates:
                return run_locally(view, loss=True)
            peer = self.rng.choice(candidates)
            started = self.clock()
            try:
                load = await view.probe(peer)
            except Exception:  # a failed probe is a fully loaded peer
                load = None
            probing_s = self.clock() - started
            local = view.local_load()
            if isinstance(load, int) and load < local.running + local.queued:
                return Forward(peer, probing_s=probing_s)
            return run_locally(view, loss=True, probing_s=probing_s)
        peers = list(view.peers())
        index = action - FIRST_PEER
        if 0 <= index < len(peers) and peers[index] in candidates:
            return Forward(peers[index])
        return run_locally(view, loss=True)  # no such peer in the view (it is shorter than maxPeers)
