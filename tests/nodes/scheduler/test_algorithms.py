"""The registry, parameters and names, and the header precedence of ``decide``."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.scheduler.algorithms import build_algorithm, decide, known_algorithms
from nodes.scheduler.base import Execute, Forward, Reject, SchedulingAlgorithm
from nodes.scheduler.forward import ForwardScheduler
from nodes.scheduler.no_scheduler import NoScheduler
from nodes.scheduler.power_of_n import PowerOfNScheduler

P2PFAAS_ALGORITHMS = {
    "NoScheduler", "ForwardScheduler", "PowerOfNScheduler", "PowerOfNSchedulerTau",
    "RoundRobinWithMasterScheduler", "RejectScheduler",
}


def test_registry_knows_every_algorithm():
    assert P2PFAAS_ALGORITHMS <= set(known_algorithms())


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="PowerOfNScheduler"):
        build_algorithm("PowerOfTwo", [])


@pytest.mark.parametrize(("name", "parameters", "described"), [
    ("ForwardScheduler", ["3"], "ForwardScheduler(3)"),
    ("PowerOfNScheduler", ["1", "2", "true", "1"], "PowerOfNScheduler(1, 2, true, 1)"),
    ("PowerOfNScheduler", ["4", "0", "false", "3"], "PowerOfNScheduler(4, 0, false, 3)"),
    ("PowerOfNSchedulerTau", ["1", "2", "true", "1", "100ms"], "PowerOfNSchedulerTau(1, 2, true, 1, 100ms)"),
    ("RoundRobinWithMasterScheduler", ["true", "m", "false"], "RoundRobinWithMasterScheduler(true, m, false)"),
    ("RoundRobinWithMasterScheduler", ["false", "node-1", "true"],
     "RoundRobinWithMasterScheduler(false, node-1, true)"),
])
def test_parameters_round_trip_and_describe_like_p2pfaas(name, parameters, described):
    algorithm = build_algorithm(name, parameters)
    assert algorithm.parameters() == parameters
    assert algorithm.describe() == described


@pytest.mark.parametrize(("name", "described"), [
    ("ForwardScheduler", "ForwardScheduler(1)"),
    ("PowerOfNScheduler", "PowerOfNScheduler(1, 2, true, 1)"),
    ("PowerOfNSchedulerTau", "PowerOfNSchedulerTau(1, 2, true, 1, 100ms)"),
])
def test_no_parameters_means_the_defaults(name, described):
    assert build_algorithm(name, []).describe() == described


def test_tau_is_printed_in_milliseconds_like_p2pfaas():
    assert build_algorithm("PowerOfNSchedulerTau", ["2", "1", "false", "2", "1.5s"]).describe() == (
        "PowerOfNSchedulerTau(2, 1, false, 2, 1500ms)"
    )


@pytest.mark.parametrize(("name", "parameters", "message"), [
    ("ForwardScheduler", ["-1"], "maxHops"),
    ("ForwardScheduler", ["1", "2"], r"\[maxHops\]"),
    ("ForwardScheduler", ["one"], "maxHops"),
    ("PowerOfNScheduler", ["0", "2", "true", "1"], "fan-out"),
    ("PowerOfNScheduler", ["1", "2", "true"], r"\[F, T, loss, maxHops\]"),
    ("PowerOfNScheduler", ["1", "x", "true", "1"], "threshold"),
    ("PowerOfNScheduler", ["1", "2", "perhaps", "1"], "boolean"),
    ("PowerOfNScheduler", ["1", "2", "true", "4294967296"], "maxHops"),
    ("PowerOfNSchedulerTau", ["1", "2", "true", "1"], "tau"),
    ("PowerOfNSchedulerTau", ["1", "2", "true", "1", "100"], "duration"),
    ("PowerOfNSchedulerTau", ["1", "2", "true", "1", "-5ms"], "negative"),
    ("PowerOfNSchedulerTau", ["1", "2", "true", "1", "1h"], "at most 10000ms"),
])
def test_bad_parameters_are_refused_clearly(name, parameters, message):
    with pytest.raises(ValueError, match=message):
        build_algorithm(name, parameters)


@given(f=st.integers(1, 2**32 - 1), t=st.integers(0, 2**32 - 1), loss=st.booleans(),
       hops=st.integers(0, 2**32 - 1), tau_ms=st.integers(0, 10**4))
def test_power_of_n_parameters_round_trip(f, t, loss, hops, tau_ms):
    p = [str(f), str(t), str(loss).lower(), str(hops)]
    assert build_algorithm("PowerOfNScheduler", p).parameters() == p
    assert build_algorithm("PowerOfNSchedulerTau", [*p, f"{tau_ms}ms"]).parameters() == [*p, f"{tau_ms}ms"]


# --- header precedence -------------------------------------------------------


async def test_headers_take_precedence_in_p2pfaas_order(fake):
    """P2PFaaS's /function handler: bypass, then forward, then reject."""
    view = fake.View(peer_loads={"n1": 0})
    assert await decide(NoScheduler(loss=False), fake.request(force_reject=True, bypass=True), view) == Execute()
    forwarded = await decide(NoScheduler(loss=False), fake.request(force_reject=True, force_forward=True), view)
    assert forwarded == Forward("n1")
    decision = await decide(NoScheduler(loss=False), fake.request(force_reject=True), view)
    assert isinstance(decision, Reject) and decision.code == 401


async def test_overload_cannot_be_scheduled_while_a_rejection_is_deliberate(fake):
    full = fake.View(load=fake.load(running=3, slots=3))
    overloaded = await decide(NoScheduler(loss=True), fake.request(), full)
    assert isinstance(overloaded, Reject) and overloaded.code == 400
    deliberate = await decide(NoScheduler(loss=True), fake.request(force_reject=True), fake.View())
    assert isinstance(deliberate, Reject) and deliberate.code == 401


async def test_bypass_runs_locally_whatever_the_algorithm(fake):
    view = fake.View(peer_loads={"n1": 0})
    req = fake.request(bypass=True, force_forward=True)
    assert await decide(ForwardScheduler(5), req, view) == Execute()


async def test_bypass_keeps_loss_on(fake):
    view = fake.View(load=fake.load(running=3, slots=3), peer_loads={"n1": 0})
    assert isinstance(await decide(NoScheduler(loss=False), fake.request(bypass=True), view), Reject)


async def test_forward_header_sends_a_local_only_algorithm_to_a_random_peer(fake):
    view = fake.View(peer_loads={"n1": 0, "n2": 0, "n3": 0})
    rng = random.Random(5)
    picks = {(await decide(NoScheduler(), fake.request(force_forward=True), view, rng=rng)).peer
             for _ in range(40)}
    assert picks == {"n1", "n2", "n3"}


async def test_forward_header_is_bounded_like_forward_scheduler_1(fake):
    view = fake.View(peer_loads={"n1": 0, "n2": 0})
    again = fake.forwarded(fake.request(force_forward=True), by="n1")  # the header travelled along
    assert await decide(NoScheduler(), again, view) == Execute()
    assert await decide(NoScheduler(), fake.request(force_forward=True), fake.View()) == Execute()


async def test_without_headers_the_algorithm_decides(fake):
    view = fake.View(load=fake.load(running=5), peer_loads={"n1": 0})
    decision = await decide(PowerOfNScheduler(1, 2), fake.request(), view)
    assert isinstance(decision, Forward) and decision.peer == "n1"


class Boomerang(SchedulingAlgorithm):
    """A broken algorithm (not registered: no ``name``) that sends requests back where they came from."""

    @classmethod
    def from_parameters(cls, parameters):
        return cls()

    def parameters(self):
        return []

    def describe(self):
        return "Boomerang()"

    async def schedule(self, request, view):
        return Forward(request.peers[-1] if request.peers else view.node_id, probing_s=0.5)


async def test_decide_never_lets_a_request_go_back_to_a_visited_node(fake):
    view = fake.View(peer_loads={"n1": 0})
    assert await decide(Boomerang(), fake.forwarded(fake.request(), by="n1"), view) == Execute(probing_s=0.5)
    assert await decide(Boomerang(), fake.request(), view) == Execute(probing_s=0.5)
    assert "Boomerang" not in known_algorithms()
