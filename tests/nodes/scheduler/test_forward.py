"""ForwardScheduler [maxHops]: a random unvisited peer while the hop budget lasts."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.scheduler.base import Execute, Forward
from nodes.scheduler.forward import ForwardScheduler


async def test_no_peers_runs_locally(fake):
    decision = await ForwardScheduler(1).schedule(fake.request(), fake.View())
    assert decision == Execute()


async def test_client_request_goes_to_a_random_peer(fake):
    view = fake.View(peer_loads={"n1": 0, "n2": 0, "n3": 0})
    sched = ForwardScheduler(1, rng=random.Random(7))
    picks = {(await sched.schedule(fake.request(), view)).peer for _ in range(60)}
    assert picks == {"n1", "n2", "n3"}  # random, not always the first
    assert view.probed == []            # forwarding blindly: nobody is probed


async def test_forwarded_request_stops_at_max_hops(fake):
    view = fake.View(peer_loads={"n1": 0, "n2": 0})
    once = fake.forwarded(fake.request(), by="n9")
    assert await ForwardScheduler(1).schedule(once, view) == Execute()
    assert isinstance(await ForwardScheduler(2).schedule(once, view), Forward)


async def test_max_hops_zero_never_forwards(fake):
    view = fake.View(peer_loads={"n1": 0})
    assert await ForwardScheduler(0).schedule(fake.request(), view) == Execute()


async def test_never_forwards_to_a_visited_node(fake):
    view = fake.View(node_id="n0", peer_loads={"n1": 0, "n2": 0, "n3": 0})
    req = fake.forwarded(fake.forwarded(fake.request(), by="n1"), by="n2")
    sched = ForwardScheduler(5, rng=random.Random(1))
    for _ in range(20):
        assert await sched.schedule(req, view) == Forward("n3")
    every_peer_visited = fake.forwarded(req, by="n3")
    assert await sched.schedule(every_peer_visited, view) == Execute()


async def walk(fake, algorithms, views, origin: str):
    """Follow a request through the cluster; returns the path and the final decision."""
    req, node, path = fake.request(), origin, [origin]
    for _ in range(4 * len(algorithms) + 8):   # bounded: a chain that never ends fails, not hangs
        decision = await algorithms[node].schedule(req, views[node])
        if not isinstance(decision, Forward):
            return path, decision
        req, node = fake.forwarded(req, by=node), decision.peer
        path.append(node)
    pytest.fail(f"the forwarding chain did not end: {path}")


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 7), max_hops=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_chains_are_bounded_and_never_revisit(fake, nodes, max_hops, seed):
    ids = [f"n{i}" for i in range(nodes)]
    rng = random.Random(seed)
    views = {n: fake.View(node_id=n, peer_loads={p: 0 for p in ids if p != n}) for n in ids}
    algorithms = {n: ForwardScheduler(max_hops, rng=rng) for n in ids}
    path, decision = asyncio.run(walk(fake, algorithms, views, "n0"))
    assert decision == Execute()
    assert len(path) == len(set(path))                  # no node twice
    assert len(path) - 1 == min(max_hops, nodes - 1)    # forwards until the budget or the nodes run out
