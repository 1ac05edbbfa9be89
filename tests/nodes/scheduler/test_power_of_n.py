"""PowerOfNScheduler [F, T, loss, maxHops] and PowerOfNSchedulerTau [..., tau]."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.scheduler.base import Execute, Forward, Reject
from nodes.scheduler.power_of_n import (
    PowerOfNScheduler,
    PowerOfNSchedulerTau,
    format_go_duration,
    parse_go_duration,
)


class StepClock:
    """Each reading advances by ``step`` seconds: probing time becomes exact."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


async def test_below_threshold_runs_locally_without_probing(fake):
    view = fake.View(load=fake.load(running=1), peer_loads={"n1": 0})
    assert await PowerOfNScheduler(1, 2).schedule(fake.request(), view) == Execute()
    assert view.probed == []


async def test_threshold_counts_running_plus_queued(fake):
    view = fake.View(load=fake.load(running=1, queued=1, queue_max=2, queue_enabled=True),
                     peer_loads={"n1": 0})
    sched = PowerOfNScheduler(1, 2, clock=StepClock(0.01))
    assert await sched.schedule(fake.request(), view) == Forward("n1", probing_s=pytest.approx(0.01))


async def test_probes_f_distinct_peers_in_parallel(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={f"n{i}": 5 for i in range(1, 9)})
    await PowerOfNScheduler(4, 2, rng=random.Random(3)).schedule(fake.request(), view)
    assert len(view.probed) == 4 and len(set(view.probed)) == 4
    assert view.max_in_flight == 4  # all four probes were out at once


async def test_fanout_larger_than_peers_probes_each_once(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={"n1": 5, "n2": 5})
    await PowerOfNScheduler(10, 2).schedule(fake.request(), view)
    assert sorted(view.probed) == ["n1", "n2"]


async def test_forwards_to_the_least_loaded_and_reports_probing_time(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={"n1": 2, "n2": 0, "n3": 1})
    sched = PowerOfNScheduler(3, 2, clock=StepClock(0.25))
    assert await sched.schedule(fake.request(), view) == Forward("n2", probing_s=0.25)


async def test_equal_load_is_not_better(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={"n1": 3, "n2": 4})
    assert isinstance(await PowerOfNScheduler(2, 2).schedule(fake.request(), view), Execute)


async def test_ties_are_broken_at_random(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={"n1": 1, "n2": 1, "n3": 2})
    sched = PowerOfNScheduler(3, 2, rng=random.Random(11))
    picks = {(await sched.schedule(fake.request(), view)).peer for _ in range(40)}
    assert picks == {"n1", "n2"}


@pytest.mark.parametrize("failure", [None, TimeoutError("probe timed out"), ConnectionError("gone")])
async def test_a_failed_probe_is_never_read_as_idle(fake, failure):
    # P2PFaaS defect: a failed probe read as load 0 and attracted the request.
    view = fake.View(load=fake.load(running=2), peer_loads={"n1": failure, "n2": failure})
    decision = await PowerOfNScheduler(2, 2, clock=StepClock(0.5)).schedule(fake.request(), view)
    assert decision == Execute(probing_s=0.5)


async def test_failed_probes_mixed_with_busy_peers_stay_local(fake):
    view = fake.View(load=fake.load(running=2), peer_loads={"n1": None, "n2": 2})
    assert isinstance(await PowerOfNScheduler(2, 2).schedule(fake.request(), view), Execute)


async def test_loss_rejects_when_full_and_nobody_is_better(fake):
    full = fake.load(running=3, slots=3)
    view = fake.View(load=full, peer_loads={"n1": 3, "n2": None})
    decision = await PowerOfNScheduler(2, 2, loss=True, clock=StepClock(0.1)).schedule(fake.request(), view)
    assert isinstance(decision, Reject) and decision.code == 400   # P2PFaaS: cannot be scheduled
    assert decision.probing_s == pytest.approx(0.1)
    assert isinstance(await PowerOfNScheduler(2, 2, loss=False).schedule(fake.request(), view), Execute)


async def test_loss_rejects_when_full_even_below_threshold_or_without_peers(fake):
    full = fake.load(running=3, slots=3)
    assert isinstance(await PowerOfNScheduler(1, 10).schedule(fake.request(), fake.View(load=full)), Reject)
    assert isinstance(await PowerOfNScheduler(1, 2).schedule(fake.request(), fake.View(load=full)), Reject)


async def test_loss_counts_a_free_queue_place_as_room(fake):
    queued = fake.load(running=3, queued=1, slots=3, queue_max=2, queue_enabled=True)
    view = fake.View(load=queued, peer_loads={"n1": 9})
    assert isinstance(await PowerOfNScheduler(1, 2).schedule(fake.request(), view), Execute)


async def test_max_hops_bounds_forwarded_requests(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={"n1": 0})
    once = fake.forwarded(fake.request(), by="n9")
    assert await PowerOfNScheduler(1, 2, max_hops=1).schedule(once, view) == Execute()
    assert view.probed == []
    assert isinstance(await PowerOfNScheduler(1, 2, max_hops=2).schedule(once, view), Forward)


async def test_never_probes_or_forwards_to_a_visited_node(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={"n1": 0, "n2": 2})
    req = fake.forwarded(fake.request(), by="n1")  # n1, the idle one, sent it here
    for seed in range(10):
        view.probed.clear()
        decision = await PowerOfNScheduler(2, 2, max_hops=3, rng=random.Random(seed)).schedule(req, view)
        assert decision == Forward("n2", probing_s=decision.probing_s)
        assert view.probed == ["n2"]


@pytest.mark.parametrize(("max_hops", "expected"), [
    (0, ["n0"]),
    (1, ["n0", "n1"]),
    (2, ["n0", "n1", "n2"]),
    (9, ["n0", "n1", "n2", "n3", "n4"]),  # n4 is below T: the chain ends there by itself
])
async def test_chain_on_a_line_follows_falling_load_up_to_max_hops(fake, max_hops, expected):
    loads = [9, 7, 5, 3, 1]
    ids = [f"n{i}" for i in range(len(loads))]
    views = {  # a line: each node only knows its neighbours
        n: fake.View(node_id=n, load=fake.load(running=loads[i], slots=10),
                     peer_loads={ids[j]: loads[j] for j in (i - 1, i + 1) if 0 <= j < len(ids)})
        for i, n in enumerate(ids)
    }
    sched = PowerOfNScheduler(2, 2, max_hops=max_hops, rng=random.Random(0))
    req, node, path = fake.request(), "n0", ["n0"]
    while isinstance(decision := await sched.schedule(req, views[node]), Forward):
        req, node = fake.forwarded(req, by=node), decision.peer
        path.append(node)
        assert len(path) <= len(ids) + max_hops, f"the forwarding chain did not end: {path}"
    assert path == expected


peer_answer = st.one_of(st.none(), st.integers(0, 12), st.just(TimeoutError("late")))


@settings(max_examples=200, deadline=None)
@given(
    fanout=st.integers(1, 5), threshold=st.integers(0, 6), loss=st.booleans(), max_hops=st.integers(0, 3),
    running=st.integers(0, 6), queued=st.integers(0, 3), answers=st.lists(peer_answer, max_size=7),
    visited=st.sets(st.integers(0, 6)), hops=st.integers(0, 4), seed=st.integers(0, 2**16),
)
def test_power_of_n_invariants(fake, fanout, threshold, loss, max_hops, running, queued, answers,
                               visited, hops, seed):
    peer_loads = {f"n{i + 1}": a for i, a in enumerate(answers)}
    load = fake.load(running=running, queued=queued, slots=4, queue_max=2, queue_enabled=True)
    view = fake.View(load=load, peer_loads=peer_loads)
    path = tuple(f"n{i}" for i in sorted(visited))  # may include n0 (this node) and unknown peers
    req = fake.request(external=hops > 0, hops=hops, peers=path)
    sched = PowerOfNScheduler(fanout, threshold, loss, max_hops, rng=random.Random(seed))
    decision = asyncio.run(sched.schedule(req, view))

    own = running + queued
    unvisited = [p for p in peer_loads if p not in path]
    assert len(view.probed) == len(set(view.probed))                 # distinct
    assert not set(view.probed) & set(path)                           # never a visited node
    probing = own >= threshold and hops < max_hops and bool(unvisited)
    assert len(view.probed) == (min(fanout, len(unvisited)) if probing else 0)
    good = {p: peer_loads[p] for p in view.probed if isinstance(peer_loads[p], int)}
    if isinstance(decision, Forward):
        assert decision.peer in good and good[decision.peer] == min(good.values()) < own
    elif good and min(good.values()) < own:
        pytest.fail(f"stayed local although {good} has a peer below {own}")
    if isinstance(decision, Reject):
        assert loss and not load.has_room


async def test_tau_counts_running_only(fake):
    view = fake.View(load=fake.load(running=1, queued=2, queue_max=2, queue_enabled=True),
                     peer_loads={"n1": 0})
    assert await PowerOfNSchedulerTau(1, 2, tau_ns=0).schedule(fake.request(), view) == Execute()
    assert view.probed == []


class RecordedSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


async def test_tau_pads_probing_to_tau_and_reports_the_measured_probe(fake):
    view = fake.View(load=fake.load(running=3), peer_loads={"n1": 0})
    sleep = RecordedSleep()
    sched = PowerOfNSchedulerTau(1, 2, tau_ns=parse_go_duration("100ms"), clock=StepClock(0.03), sleep=sleep)
    decision = await sched.schedule(fake.request(), view)
    # clock readings: 0.03 start, 0.06 probes back, 0.09 when padding is computed
    assert decision == Forward("n1", probing_s=pytest.approx(0.03))
    assert sleep.calls == [pytest.approx(0.1 - 0.06)]


async def test_tau_does_not_pad_a_slow_probe_or_a_local_decision(fake):
    sleep = RecordedSleep()
    slow = PowerOfNSchedulerTau(1, 2, tau_ns=parse_go_duration("10ms"), clock=StepClock(0.5), sleep=sleep)
    await slow.schedule(fake.request(), fake.View(load=fake.load(running=3), peer_loads={"n1": 0}))
    idle = PowerOfNSchedulerTau(1, 2, tau_ns=parse_go_duration("1s"), sleep=sleep)
    await idle.schedule(fake.request(), fake.View(load=fake.load(running=0), peer_loads={"n1": 0}))
    assert sleep.calls == []


async def test_tau_really_waits(fake):
    sched = PowerOfNSchedulerTau(1, 2, tau_ns=parse_go_duration("40ms"))
    started = time.perf_counter()
    await sched.schedule(fake.request(), fake.View(load=fake.load(running=3), peer_loads={"n1": 9}))
    assert time.perf_counter() - started >= 0.039


@pytest.mark.parametrize(("text", "ns"), [
    ("100ms", 100_000_000), ("1s", 1_000_000_000), ("1.5s", 1_500_000_000), ("1m30s", 90_000_000_000),
    ("2h", 7_200_000_000_000), ("500us", 500_000), ("500\u00b5s", 500_000), ("7ns", 7), ("0", 0),
    (".5ms", 500_000), ("+3ms", 3_000_000), ("-1s", -1_000_000_000), (" 20ms ", 20_000_000),
])
def test_go_durations_parse(text, ns):
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize("text", ["", "100", "ms", "1x", "1 s", "1s2", "--1s", "1.2.3s", "s1"])
def test_bad_go_durations_are_refused(text):
    with pytest.raises(ValueError, match="duration"):
        parse_go_duration(text)


@pytest.mark.parametrize(("ns", "text"), [(100_000_000, "100ms"), (0, "0ms"), (1_000_000_000, "1000ms"),
                                          (1_500, "1500ns"), (2_000, "2us")])
def test_durations_format_like_p2pfaas(ns, text):
    assert format_go_duration(ns) == text
    assert parse_go_duration(text) == ns
