"""LearningScheduler without a broker: state encoding, action mapping, parameters, the
learning headers a node attaches, and the reward rule — on the in-memory view."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest

from broker import headers as H
from broker.messages import Heartbeat, LearnerAction, LearningDecision
from nodes.scheduler.algorithms import build_algorithm
from nodes.scheduler.base import Execute, Forward, Reject
from nodes.scheduler.learning import (
    LearningContext,
    LearningScheduler,
    PeerLoads,
    count_by_type,
    encode_state,
    task_type_index,
)
from nodes.scheduler.rewards import reward_of


class ScriptedLearning(LearningContext):
    """A LearningContext whose learner answers from a script (no broker)."""

    def __init__(self, actions: list[int], running=(), outstanding=(), types=None, **kw) -> None:
        super().__init__(None, "n0", lambda: (set(running), set(outstanding)), **kw)  # type: ignore[arg-type]
        self.script = list(actions)
        self.states: list[list[float]] = []
        self.sized: list[int] = []
        self.types.update(types or {})

    async def configure_actions(self, n_actions: int) -> None:
        self.sized.append(n_actions)

    async def act(self, state, explore):
        self.states.append(state)
        if not self.script:
            return None  # the learner does not answer
        return LearnerAction(action=self.script.pop(0), eps=0.25 if explore else 0.0, model="scheduling",
                             algorithm="dsarsa")


def view_with(fake, learning=None, **kw):
    view = fake.View(**kw)
    view.learning = learning
    return view


def test_task_type_index_and_state_encoding():
    assert [task_type_index(t, 3) for t in (None, 0.0, 1.0, 2.9, 7.0, -1.0, float("nan"))] == [0, 0, 1, 2, 2, 0, 0]
    assert encode_state(1, [2, 0], [0, 3]) == [1.0, 2.0, 0.0, 0.0, 3.0]
    types = {"a": 0, "b": 1, "c": 1, "d": 5}
    # a and b run, c and d wait (d's type is beyond the range: the last type), e runs untyped (type 0)
    assert count_by_type(types, running={"a", "b", "e"}, outstanding={"a", "b", "c", "d"}, n_types=2) == ([2, 1], [0, 2])
    assert count_by_type({}, set(), set(), 1) == ([0], [0])


def test_parameters_defaults_round_trip_and_errors():
    s = build_algorithm("LearningScheduler", ["2"])
    assert isinstance(s, LearningScheduler) and s.parameters() == ["2", "2", "true", "true"] and s.n_actions == 5
    assert s.describe() == "LearningScheduler(2, 2, true, true)"
    assert build_algorithm("LearningScheduler", []).parameters() == ["1", "2", "true", "true"]
    s = build_algorithm("LearningScheduler", ["3", "4", "false", "false"])
    assert (s.num_task_types, s.max_peers, s.explore, s.peer_loads, s.n_actions) == (3, 4, False, False, 7)
    assert build_algorithm("LearningScheduler", s.parameters()).parameters() == s.parameters()
    for bad in (["0"], ["x"], ["1", "-1"], ["1", "2", "maybe"], ["1", "2", "true", "9"], ["1", "2", "true", "true", "1"]):
        with pytest.raises(ValueError):
            build_algorithm("LearningScheduler", bad)


@pytest.mark.parametrize("action, expected", [
    (0, Reject), (1, Execute), (3, Forward), (4, Forward), (5, Execute), (99, Execute),
])
async def test_action_mapping(fake, action, expected):
    view = view_with(fake, peer_loads={"p1": 0, "p2": 0})
    decision = await LearningScheduler(1, 3).carry_out(action, fake.request(), view)
    assert type(decision) is expected
    if action in (3, 4):
        assert decision.peer == ["p1", "p2"][action - 3]


async def test_local_action_rejects_when_full_and_forward_skips_visited_peers(fake):
    full = view_with(fake, load=fake.load(running=2, slots=2), peer_loads={"p1": 0, "p2": 0})
    s = LearningScheduler(1, 2)
    assert isinstance(await s.carry_out(1, fake.request(), full), Reject)
    # p1 is on the request's path already: forwarding there would loop, so it runs here (and is full)
    assert isinstance(await s.carry_out(3, fake.request(peers=("p1",)), full), Reject)
    assert (await s.carry_out(4, fake.request(peers=("p1",)), full)).peer == "p2"


@pytest.mark.parametrize("probe_answer, forwards", [(0, True), (2, False), (5, False), (None, False),
                                                    (TimeoutError("slow"), False)])
async def test_probe_and_forward_forwards_only_to_a_less_loaded_peer(fake, probe_answer, forwards):
    view = view_with(fake, load=fake.load(running=2, slots=4), peer_loads={"p1": probe_answer})
    decision = await LearningScheduler(1, 1, rng=random.Random(1)).carry_out(2, fake.request(), view)
    assert view.probed == ["p1"]
    assert isinstance(decision, Forward if forwards else Execute)
    assert decision.probing_s >= 0


async def test_probe_and_forward_without_peers_runs_here(fake):
    view = view_with(fake, peer_loads={})
    assert isinstance(await LearningScheduler().carry_out(2, fake.request(), view), Execute)


async def test_schedule_encodes_state_sizes_model_and_records_decision(fake):
    ctx = ScriptedLearning([3], running={"c1.a"}, outstanding={"c1.a", "c1.b"}, types={"c1.a": 1, "c1.b": 0})
    view = view_with(fake, ctx, peer_loads={"p1": 0})
    s = LearningScheduler(2, 1, peer_loads=False)   # P2PFaaS's state
    decision = await s.schedule(fake.request(task_type=1.0), view)
    assert decision == Forward("p1")
    assert ctx.sized == [4]
    assert ctx.states == [[1.0, 0.0, 1.0, 1.0, 0.0]]   # type 1; running [0, 1]; queued [1, 0]
    pending = ctx.rewards.pending["c1.r1"]
    assert pending.decision.state == ctx.states[0] and pending.decision.action == 3 and pending.decision.eps == 0.25
    assert pending.deadline_s == ctx.default_deadline_s


async def test_eids_are_consecutive_and_deadlines_follow_the_type(fake):
    ctx = ScriptedLearning([1, 1, 0], deadlines={0: 0.5, 1: 2.0})
    view = view_with(fake, ctx)
    s = LearningScheduler(2, 0)
    for i, task_type in enumerate((0.0, 1.0, 7.0)):
        await s.schedule(replace(fake.request(task_type=task_type), request_id=f"r{i}"), view)
    entries = [ctx.rewards.pending[f"c1.r{i}"] for i in range(3)]
    eids = [e.decision.eid for e in entries]
    assert eids == list(range(eids[0], eids[0] + 3))
    assert [e.deadline_s for e in entries] == [0.5, 2.0, 1.0]   # type 7: in the state as type 1, its own deadline


async def test_external_requests_run_here_without_asking_the_learner(fake):
    ctx = ScriptedLearning([0])
    view = view_with(fake, ctx, peer_loads={"p1": 0})
    assert isinstance(await LearningScheduler().schedule(fake.forwarded(fake.request(), "p1"), view), Execute)
    assert ctx.states == [] and not ctx.rewards.pending


async def test_without_learner_requests_run_here_unrecorded(fake):
    ctx = ScriptedLearning([])  # the learner does not answer
    assert isinstance(await LearningScheduler().schedule(fake.request(), view_with(fake, ctx)), Execute)
    assert not ctx.rewards.pending
    assert isinstance(await LearningScheduler().schedule(fake.request(), view_with(fake, None)), Execute)


async def test_annotate_carries_own_or_origin_decision_and_drops_a_clients(fake):
    ctx = ScriptedLearning([1])
    view = view_with(fake, ctx)
    request = fake.request(task_type=1.0)
    decision = await LearningScheduler(2).schedule(request, view)
    forged = {H.LEARNING_EID: "7", H.LEARNING_STATE: "9", H.LEARNING_ACTION: "0", H.LEARNING_EPS: "1", "X-Other": "y"}
    own = ctx.annotate("c1.r1", request, decision, forged)
    carried = LearningDecision.from_headers(own)
    assert carried == ctx.rewards.pending["c1.r1"].decision and own["X-Other"] == "y"
    assert ctx.types == {"c1.r1": 1}
    # a request this node did not decide: a client's headers go, a forwarded one's stay
    other = replace(fake.request(), request_id="r2")
    assert ctx.annotate("c1.r2", other, Execute(), forged) == {"X-Other": "y"}
    external = fake.forwarded(other, "p1")
    assert ctx.annotate("c1.r2", external, Execute(), forged) == forged


def heartbeat(node: str, running: int, slots: int) -> Heartbeat:
    return Heartbeat(node=node, running=running, parallel_running_functions_max=slots, time=time.time())


async def test_peer_aware_state_from_heartbeats_forwards_to_a_peer_with_room(fake):
    ctx = ScriptedLearning([4])
    ctx.peer_loads.observe(heartbeat("p1", running=4, slots=4))
    ctx.peer_loads.observe(heartbeat("p2", running=1, slots=6))
    view = view_with(fake, ctx, load=fake.load(running=1, slots=4), peer_loads={"p1": 4, "p2": 1})
    decision = await LearningScheduler(2, 2).schedule(fake.request(task_type=1.0), view)
    assert ctx.states == [[1.0, 2.0, 0.0, 2.0]]    # 3 free here (2+), p1 full, p2 5 free (2+)
    assert view.probed == []                        # a slot is free here: heartbeats are enough
    assert decision == Forward("p2")
    assert ctx.peer_loads.free_slots("p2") == 4     # our forward counts until p2's next heartbeat
    ctx.peer_loads.observe(heartbeat("p2", running=2, slots=6))
    assert ctx.peer_loads.free_slots("p2") == 4


def test_forwards_kept_per_peer_stay_bounded_whoever_reads_them():
    """Forwards were pruned only when free_slots() read a heartbeat peer: never for a P2PFaaS machine
    (no heartbeat), nor while this node stayed saturated (peers probed): one float per forward, for ever."""
    now = [100.0]
    loads = PeerLoads("n0", clock=lambda: now[0])
    loads.observe(heartbeat("p1", running=0, slots=4).model_copy(update={"time": 100.0}))
    for _ in range(5000):                # within one heartbeat period
        now[0] += 0.0001
        loads.forwarded("p1")            # a heartbeat peer, its load never read from heartbeats
        loads.forwarded("http-10-0-0-9")  # a P2PFaaS machine: no heartbeat, nothing to correct
    assert len(loads._forwards["p1"]) <= PeerLoads.COUNTED and "http-10-0-0-9" not in loads._forwards
    assert loads.free_slots("p1") == 0
    loads.observe(heartbeat("p1", running=1, slots=4).model_copy(update={"time": now[0]}))
    now[0] += 0.001
    loads.forwarded("p1")                # the new heartbeat covers the older forwards: only this one counts
    assert len(loads._forwards["p1"]) == 1 and loads.free_slots("p1") == 2


async def test_without_peer_loads_forwards_are_not_kept(fake):
    ctx = ScriptedLearning([3] * 50)
    ctx.peer_loads.observe(heartbeat("p1", running=0, slots=4))
    view = view_with(fake, ctx, load=fake.load(running=0, slots=4), peer_loads={"p1": 0})
    for _ in range(50):
        assert await LearningScheduler(1, 1, peer_loads=False).schedule(fake.request(), view) == Forward("p1")
    assert not ctx.peer_loads._forwards   # nothing reads them without the peer-aware state


async def test_with_no_free_slot_here_peers_are_probed_and_a_failed_probe_is_a_full_peer(fake):
    ctx = ScriptedLearning([3])
    for peer in ("p1", "p2"):
        ctx.peer_loads.observe(heartbeat(peer, running=0, slots=4))    # stale: both look idle
    view = view_with(fake, ctx, load=fake.load(running=4, slots=4), peer_loads={"p1": 3, "p2": TimeoutError("slow")})
    decision = await LearningScheduler(1, 2).schedule(fake.request(), view)
    assert ctx.states == [[0.0, 0.0, 1.0, 0.0]]    # probed: p1 has one free slot, p2 did not answer
    assert sorted(view.probed) == ["p1", "p2"] and decision == Forward("p1", probing_s=decision.probing_s)


async def test_a_peer_without_heartbeat_or_beyond_the_view_has_no_known_room(fake):
    ctx = ScriptedLearning([1])
    view = view_with(fake, ctx, load=fake.load(running=0, slots=2), peer_loads={"p1": 0})
    await LearningScheduler(1, 3).schedule(fake.request(), view)
    assert ctx.states == [[0.0, 2.0, 0.0, 0.0, 0.0]]   # p1 never beat; the view has one peer of three


def test_learning_decision_headers_round_trip():
    d = LearningDecision(eid=12, state=[1.0, 0.0, 2.0], action=4, eps=0.125)
    h = d.headers()
    assert h == {H.LEARNING_EID: "12", H.LEARNING_STATE: "1,0,2", H.LEARNING_ACTION: "4", H.LEARNING_EPS: "0.125"}
    assert LearningDecision.from_headers(h) == d
    assert LearningDecision.from_headers({}) is None
    assert LearningDecision.from_headers({**h, H.LEARNING_ACTION: "x"}) is None


def test_reward_rule():
    assert reward_of(200, 0.4, 0.5) == 1.0
    assert reward_of(200, 0.5, 0.5) == 1.0
    assert reward_of(200, 0.6, 0.5) == 0.0
    assert reward_of(500, 0.1, 0.5) == 0.0
    assert reward_of(503, 0.0, 10.0) == 0.0   # a rejection


async def test_rewards_are_released_in_eid_order():
    from nodes.scheduler.rewards import RewardTracker

    tracker = RewardTracker(None, "n0")  # type: ignore[arg-type]  (nothing is published here)
    for eid, key in enumerate("abc"):
        tracker.track(f"c.{key}", LearningDecision(eid=eid, state=[0.0], action=1), 1.0)

    async def answer(key: str, total_s: float) -> None:
        tracker.observe(f"c.{key}", 200, total_s)

    def released() -> list[tuple[int, float]]:
        out = []
        while not tracker._queue.empty():
            e = tracker._queue.get_nowait()
            out.append((e.eid, e.reward))
        return out

    await answer("c", 0.1)
    await answer("x", 0.1)            # not decided here: ignored
    assert released() == []           # c waits for a and b
    await answer("a", 2.0)
    assert released() == [(0, 0.0)]   # late: reward 0, and b is still out
    await answer("b", 0.5)
    assert released() == [(1, 1.0), (2, 1.0)]
    assert not tracker.pending and tracker.stats.met == 2


def test_membership_exposes_the_heartbeat_load_of_alive_peers_only():
    from nodes.discovery.membership import MembershipView

    view = MembershipView("me", period_s=1.0, suspect_after=3, remove_after=10)
    view.observe(Heartbeat(node="a", running=3, queued=1, parallel_running_functions_max=6, queue_length_max=2,
                           time=100.0), now=100.0)
    load = view.load("a", now=101.0)
    assert (load.running, load.queued, load.slots, load.queue_max, load.at, load.free_slots) == (3, 1, 6, 2, 100.0, 2)
    assert view.loads(101.0) == {"a": load}
    assert view.load("a", now=104.0) is None and view.loads(104.0) == {}   # suspected: not offered
    assert view.load("nobody", now=101.0) is None
