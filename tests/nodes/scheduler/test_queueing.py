"""Erlang-B and the loss-system bounds of the P2P scheduling experiment."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.scheduler.queueing import (
    erlang_b,
    finite_queue_blocking,
    local_only_blocking,
    offered_load,
    pooled_blocking,
)


def erlang_b_exact(servers: int, load: Fraction) -> Fraction:
    """The textbook formula (A^c / c!) / sum_k A^k / k!, in exact arithmetic."""
    terms = [load**k / math.factorial(k) for k in range(servers + 1)]
    return terms[-1] / sum(terms)


@pytest.mark.parametrize(("servers", "load", "blocking"), [
    (1, 1, 0.5), (2, 1, 0.2), (3, 1, 1 / 16), (3, 2, 4 / 19), (0, 3.5, 1.0), (4, 0, 0.0),
])
def test_known_values(servers, load, blocking):
    assert erlang_b(servers, load) == pytest.approx(blocking, rel=1e-12)


@pytest.mark.parametrize(("servers", "load"), [(5, 1.36), (10, 4.461), (20, 12.031), (50, 37.901), (100, 84.064)])
def test_published_one_percent_table(servers, load):
    # Rows of the standard Erlang-B table: offered load giving 1 % blocking.
    assert erlang_b(servers, load) == pytest.approx(0.01, rel=5e-3)  # the table has 3-4 digits


@pytest.mark.parametrize(("servers", "load", "blocking"), [(10, 5, 0.018385), (10, 10, 0.214582), (20, 15, 0.045593)])
def test_published_table_values(servers, load, blocking):
    assert erlang_b(servers, load) == pytest.approx(blocking, abs=1e-6)


@given(servers=st.integers(0, 40), load=st.fractions(0, 60, max_denominator=50))
def test_recursion_matches_the_closed_form(servers, load):
    assert erlang_b(servers, float(load)) == pytest.approx(float(erlang_b_exact(servers, load)), rel=1e-9, abs=1e-300)


def test_large_systems_neither_overflow_nor_underflow_to_nonsense():
    b = erlang_b(10_000, 9_000.0)
    assert 0.0 < b < 1e-20
    assert 0.0 < erlang_b(10_000, 12_000.0) == pytest.approx(1 - 10_000 / 12_000, rel=0.01)  # overload: ~1 - c/A


@given(servers=st.integers(0, 200), load=st.floats(0.01, 300))
def test_blocking_falls_with_servers_and_rises_with_load(servers, load):
    b = erlang_b(servers, load)
    assert 0.0 <= b <= 1.0
    more = erlang_b(servers + 1, load)
    assert more < b or more == b == 0.0  # equal only once both underflowed
    assert erlang_b(servers, load * 1.1) >= b


@given(servers=st.integers(0, 30), load=st.floats(0, 50))
def test_no_queue_is_erlang_b(servers, load):
    assert finite_queue_blocking(servers, 0, load) == pytest.approx(erlang_b(servers, load), rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("rho", [0.3, 1.7])
@pytest.mark.parametrize("capacity", [1, 2, 5])
def test_single_server_queue_matches_mm1k(rho, capacity):
    expected = (1 - rho) * rho**capacity / (1 - rho ** (capacity + 1))
    assert finite_queue_blocking(1, capacity - 1, rho) == pytest.approx(expected, rel=1e-12)


def test_a_queue_lowers_blocking():
    assert finite_queue_blocking(3, 2, 2.0) < erlang_b(3, 2.0)
    assert local_only_blocking(3, 2.0, queue_length=2) == finite_queue_blocking(3, 2, 2.0)


def test_pooling_beats_local_only_in_the_experiment_setting():
    # 4 nodes, K = 3 slots, 2 Erlangs each (queue disabled, as in P2PFaaS experiments)
    local, pooled = local_only_blocking(3, 2.0), pooled_blocking(4, 3, 2.0)
    assert local == pytest.approx(4 / 19)
    assert pooled == pytest.approx(erlang_b(12, 8.0))
    assert pooled < local / 4
    assert pooled_blocking(1, 3, 2.0) == local


def test_offered_load_is_rate_times_service_time():
    assert offered_load(4.0, 0.5) == 2.0


@pytest.mark.parametrize(("call", "message"), [
    (lambda: erlang_b(-1, 1.0), "servers"),
    (lambda: erlang_b(True, 1.0), "servers"),
    (lambda: erlang_b(2.0, 1.0), "servers"),
    (lambda: erlang_b(2, -0.1), "offered load"),
    (lambda: erlang_b(2, math.nan), "offered load"),
    (lambda: finite_queue_blocking(2, -1, 1.0), "queue_length"),
    (lambda: pooled_blocking(0, 3, 1.0), "nodes"),
    (lambda: offered_load(-1, 1), ">= 0"),
])
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
