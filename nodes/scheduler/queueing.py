"""Loss-system formulas that bound what peer-to-peer scheduling can achieve: alone, each of n nodes
with K slots blocks with Erlang-B(K, A); perfectly pooled, the system with Erlang-B(nK, nA)."""

from __future__ import annotations

import math


def _check(servers: int, offered_load: float) -> None:
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
        raise ValueError(f"servers must be a non-negative integer, got {servers!r}")
    if not math.isfinite(offered_load) or offered_load < 0:
        raise ValueError(f"offered load (Erlangs) must be finite and >= 0, got {offered_load!r}")


def erlang_b(servers: int, offered_load: float) -> float:
    """Blocking probability of an M/M/c/c loss system (Erlang-B); ``offered_load`` in Erlangs.
    The recursion B(c) = A·B(c-1) / (c + A·B(c-1)) never overflows (unlike A^c / c!)."""
    _check(servers, offered_load)
    b = 1.0
    for c in range(1, servers + 1):
        b = offered_load * b / (c + offered_load * b)
    return b


def finite_queue_blocking(servers: int, queue_length: int, offered_load: float) -> float:
    """Blocking probability of M/M/c/(c+q), a P2PFaaS node with its queue (summed in log space)."""
    _check(servers, offered_load)
    if isinstance(queue_length, bool) or not isinstance(queue_length, int) or queue_length < 0:
        raise ValueError(f"queue_length must be a non-negative integer, got {queue_length!r}")
    if servers == 0:
        return 1.0  # nobody ever serves: as Erlang-B(0, A), everything is blocked
    if offered_load == 0:
        return 0.0
    log_a = math.log(offered_load)
    log_terms = [0.0]  # log of p_n / p_0
    for n in range(1, servers + queue_length + 1):
        log_terms.append(log_terms[-1] + log_a - math.log(min(n, servers)))
    top = max(log_terms)
    log_total = top + math.log(math.fsum(math.exp(t - top) for t in log_terms))
    return math.exp(log_terms[-1] - log_total)


def local_only_blocking(slots: int, offered_load_per_node: float, queue_length: int = 0) -> float:
    """Rejection rate when every node keeps its own requests (NoScheduler): Erlang-B(K, A)."""
    if queue_length == 0:
        return erlang_b(slots, offered_load_per_node)
    return finite_queue_blocking(slots, queue_length, offered_load_per_node)


def pooled_blocking(nodes: int, slots: int, offered_load_per_node: float) -> float:
    """The pooled lower bound Erlang-B(nK, nA): no scheduler moving requests between nodes rejects less."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
    return erlang_b(nodes * slots, nodes * offered_load_per_node)


def offered_load(arrival_rate: float, mean_service_s: float) -> float:
    """Erlangs: requests per second times mean seconds of service."""
    if arrival_rate < 0 or mean_service_s < 0:
        raise ValueError("arrival rate and service time must be >= 0")
    return arrival_rate * mean_service_s
