"""RoundRobinWithMasterScheduler [isMaster, master, loss]."""

from __future__ import annotations

import pytest

from nodes.scheduler.base import Execute, Forward, Reject
from nodes.scheduler.round_robin import RoundRobinWithMasterScheduler as RoundRobin


async def test_slave_sends_client_requests_to_the_master(fake):
    view = fake.View(node_id="s1", peer_loads={"m": 0, "s2": 0})
    assert await RoundRobin(False, "m").schedule(fake.request(), view) == Forward("m")


async def test_slave_runs_what_the_master_dealt_it(fake):
    view = fake.View(node_id="s1", peer_loads={"m": 0, "s2": 0})
    dealt = fake.forwarded(fake.forwarded(fake.request(), by="s2"), by="m")
    assert await RoundRobin(False, "m").schedule(dealt, view) == Execute()


async def test_slave_with_loss_rejects_a_dealt_request_when_full(fake):
    view = fake.View(node_id="s1", load=fake.load(running=3, slots=3), peer_loads={"m": 0})
    dealt = fake.forwarded(fake.request(), by="m")
    assert isinstance(await RoundRobin(False, "m", loss=True).schedule(dealt, view), Reject)
    assert await RoundRobin(False, "m", loss=False).schedule(dealt, view) == Execute()


async def test_slave_runs_locally_while_the_master_is_not_alive(fake):
    view = fake.View(node_id="s1", peer_loads={"s2": 0})
    assert await RoundRobin(False, "m").schedule(fake.request(), view) == Execute()


async def test_master_rejects_its_own_client_requests(fake):
    view = fake.View(node_id="m", peer_loads={"s1": 0})
    decision = await RoundRobin(True).schedule(fake.request(), view)
    assert isinstance(decision, Reject) and decision.code == 400


async def deal(fake, sched, view, origin: str, count: int) -> list[str]:
    decisions = [await sched.schedule(fake.forwarded(fake.request(), by=origin), view) for _ in range(count)]
    return [d.peer if isinstance(d, Forward) else view.node_id for d in decisions]


async def test_master_deals_round_robin_over_peers_and_itself(fake):
    view = fake.View(node_id="m", peer_loads={"a": 0, "b": 0, "c": 0})
    assert await deal(fake, RoundRobin(True), view, "x", 8) == ["a", "b", "c", "m", "a", "b", "c", "m"]


async def test_master_skips_the_node_the_request_came_from(fake):
    view = fake.View(node_id="m", peer_loads={"a": 0, "b": 0, "c": 0})
    assert await deal(fake, RoundRobin(True), view, "b", 6) == ["a", "c", "m", "a", "c", "m"]


async def test_master_survives_the_peer_list_shrinking(fake):
    # P2PFaaS defect class: an index equal to the list length must not crash.
    sched = RoundRobin(True)
    view = fake.View(node_id="m", peer_loads={"a": 0, "b": 0, "c": 0, "d": 0})
    assert await deal(fake, sched, view, "x", 4) == ["a", "b", "c", "d"]
    view.peer_loads = {"a": 0}
    assert await deal(fake, sched, view, "x", 4) == ["a", "m", "a", "m"]


async def test_master_alone_runs_dealt_requests_itself_subject_to_loss(fake):
    view = fake.View(node_id="m", load=fake.load(running=3, slots=3))
    assert isinstance(await RoundRobin(True, loss=True).schedule(fake.forwarded(fake.request(), by="x"), view),
                      Reject)
    assert await RoundRobin(True, loss=False).schedule(fake.forwarded(fake.request(), by="x"), view) == Execute()


@pytest.mark.parametrize(("params", "message"), [
    (["false", "", "true"], "needs the master"),
    (["false", "bad id!", "true"], "node id"),
    (["maybe", "m", "true"], "boolean"),
    (["true", "m"], r"\[isMaster, master, loss\]"),
])
def test_bad_parameters_are_refused_clearly(params, message):
    with pytest.raises(ValueError, match=message):
        RoundRobin.from_parameters(params)
