"""MembershipView: suspect, remove, and never resurrect from stale gossip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.messages import Heartbeat
from nodes.discovery import MembershipView, PeerStatus


def hb(node: str, time: float, **kw: object) -> Heartbeat:
    return Heartbeat(node=node, time=time, **kw)  # type: ignore[arg-type]


def view() -> MembershipView:
    return MembershipView("me", period_s=1.0, suspect_after=3, remove_after=10)


def test_a_heartbeat_makes_a_peer_alive_and_self_is_never_listed():
    v = view()
    assert v.observe(hb("b", 100.0), now=100.0)
    assert v.observe(hb("a", 100.0), now=100.0)
    assert not v.observe(hb("me", 100.0), now=100.0)
    assert v.alive(100.5) == ["a", "b"]  # sorted: a stable order for schedulers
    assert v.status("me", 100.5) is None


def test_silence_makes_a_peer_suspected_then_removed():
    v = view()
    v.observe(hb("a", 0.0), now=0.0)
    assert v.status("a", 3.0) is PeerStatus.ALIVE  # exactly suspect_after periods: still fine
    assert v.alive(3.0) == ["a"]
    assert v.status("a", 3.01) is PeerStatus.SUSPECTED
    assert v.alive(3.01) == [] and v.suspected(3.01) == ["a"]
    assert v.status("a", 10.0) is PeerStatus.SUSPECTED
    assert v.sweep(10.01) == ["a"]
    assert v.sweep(10.02) == []  # reported once
    assert v.status("a", 10.02) is PeerStatus.REMOVED
    assert v.suspected(10.02) == [] and v.heartbeat("a") is None


def test_queries_do_not_need_a_sweep():
    v = view()
    v.observe(hb("a", 0.0), now=0.0)
    assert v.status("a", 11.0) is PeerStatus.REMOVED
    assert v.alive(11.0) == [] and v.suspected(11.0) == [] and v.as_p2pfaas_list(11.0) == []
    assert v.alive(1.0) == ["a"]  # queries are pure: asking about the future changed nothing


def test_liveness_runs_on_our_clock_not_the_senders():
    v = view()
    v.observe(hb("a", 5.0), now=1000.0)  # sender's clock far behind ours
    assert v.alive(1002.0) == ["a"]


def test_a_newer_heartbeat_clears_a_suspicion():
    v = view()
    v.observe(hb("a", 0.0), now=0.0)
    assert v.alive(5.0) == []
    assert v.observe(hb("a", 5.0), now=5.0)
    assert v.alive(5.0) == ["a"]


def test_a_replayed_heartbeat_refreshes_nothing():
    v = view()
    v.observe(hb("a", 10.0), now=10.0)
    assert not v.observe(hb("a", 10.0), now=12.0)  # duplicate
    assert not v.observe(hb("a", 9.0), now=12.5)   # reordered, older
    assert v.status("a", 13.5) is PeerStatus.SUSPECTED


def test_stale_gossip_never_resurrects_a_removed_peer():
    # P2PFaaS defect: an old entry gossiped by a slow peer brought dead machines back.
    v = view()
    v.observe(hb("a", 1.0), now=1.0)
    v.observe(hb("a", 2.0), now=2.0)
    assert v.sweep(20.0) == ["a"]
    for old in (2.0, 1.0, 0.5):
        assert not v.observe(hb("a", old), now=21.0)
        assert v.alive(21.0) == []
        assert v.status("a", 21.0) is PeerStatus.REMOVED


def test_a_restarted_peer_comes_back_with_a_fresh_heartbeat():
    v = view()
    v.observe(hb("a", 2.0), now=2.0)
    v.sweep(20.0)
    assert v.observe(hb("a", 19.5, address="10.0.0.7"), now=20.5)
    assert v.alive(20.5) == ["a"]
    assert v.heartbeat("a").address == "10.0.0.7"


def test_p2pfaas_list_format():
    v = view()
    v.observe(hb("b", 99.75, address="http://10.0.0.2:18080", group="edge"), now=100.0)
    v.observe(hb("a", 100.5, address="10.0.0.1"), now=101.0)
    v.observe(hb("c", 90.0), now=90.0)  # suspected by then: not listed
    rows = v.as_p2pfaas_list(102.5)
    assert rows == [   # P2PFaaS's ip is the machine's address: the host of what the node advertises
        {"_id": 2, "ip": "10.0.0.1", "name": "a", "group_name": "default", "ping": pytest.approx(0.5),
         "last_update": 101, "alive": True, "dead_polls": 1, "address": "10.0.0.1"},
        {"_id": 1, "ip": "10.0.0.2", "name": "b", "group_name": "edge", "ping": pytest.approx(0.25),
         "last_update": 100, "alive": True, "dead_polls": 2, "address": "http://10.0.0.2:18080"},
    ]
    v.observe(hb("b", 103.0), now=102.9)  # sender clock ahead of ours: no negative ping
    assert v.as_p2pfaas_list(103.0)[1]["ping"] == 0.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"period_s": 0}, "period_s"),
    ({"suspect_after": 0}, "suspect_after"),
    ({"suspect_after": 5, "remove_after": 5}, "remove_after"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MembershipView("me", **kwargs)


beat = st.tuples(st.sampled_from(["a", "b", "c", "me"]), st.integers(0, 40), st.integers(0, 8))


@settings(max_examples=200, deadline=None)
@given(beats=st.lists(beat, max_size=25), replays=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 30))))
def test_replaying_old_heartbeats_never_changes_the_view(beats, replays):
    """Feed heartbeats (node, sent, delivery delay) in arrival order, once plain and once with
    copies of already-delivered heartbeats re-delivered later: every query must agree."""
    deliveries = sorted((sent + delay, node, float(sent)) for node, sent, delay in beats)
    extra = []
    for index, later in replays:
        if deliveries:
            arrived, node, sent = deliveries[index % len(deliveries)]
            extra.append((arrived + later + 0.5, node, sent))  # strictly after the original
    plain, gossiped = view(), view()
    events = sorted([(t, 0, n, s) for t, n, s in deliveries] + [(t, 1, n, s) for t, n, s in extra])
    for t, is_replay, node, sent in events:
        assert plain.sweep(t) == gossiped.sweep(t)  # the service sweeps every period
        if not is_replay:
            plain.observe(hb(node, sent), now=t)
        gossiped.observe(hb(node, sent), now=t)
        for probe in (t, t + 3.5, t + 10.5):
            assert gossiped.alive(probe) == plain.alive(probe)
            assert gossiped.suspected(probe) == plain.suspected(probe)
            assert "me" not in plain.alive(probe)
