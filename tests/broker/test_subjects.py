"""Subjects/topics: built and parsed in one place (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import InvalidSubject, InvalidToken
from broker.subjects import Subjects, from_mqtt, to_mqtt

token = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
s = Subjects("faas")


@given(node=token.filter(lambda n: n not in {"result", "reject", "membership", "deadletter"}), fn=token, client=token, req=token)
def test_request_subject_round_trips_through_mqtt(node, fn, client, req):
    subject = s.request(node, fn, client, req)
    assert from_mqtt(to_mqtt(subject)) == subject
    inv = s.parse_invocation(subject)
    assert (inv.node, inv.kind, inv.fn, inv.client, inv.request_id) == (node, "request", fn, client, req)


def test_readme_topics():
    assert to_mqtt(s.request("n1", "fib", "dev1", "r1")) == "faas/n1/request/fib/dev1/r1"
    assert to_mqtt(s.result("dev1", "r1")) == "faas/result/dev1/r1"
    assert s.forward("n2", "fib", "dev1", "r1") == "faas.n2.forward.fib.dev1.r1"


@pytest.mark.parametrize("bad", ["", "a b", "a.b", "x" * 65, "é", "a/b", "*", ">", "fib\n", "fib\r\n"])
def test_bad_tokens_are_refused_with_a_reason(bad):
    with pytest.raises(InvalidToken, match="invalid function"):
        s.request("n1", bad, "c", "r")


@pytest.mark.parametrize("subject", ["faas.n1.request.fib.dev1", "faas.n1.request.fib.dev1.r1.x",
                                     "other.n1.request.fib.d.r", "faas.n1.reply.fib.d.r"])
def test_malformed_invocation_subjects(subject):
    with pytest.raises(InvalidSubject):
        s.parse_invocation(subject)


def test_reserved_node_ids_and_salvage():
    with pytest.raises(InvalidToken, match="reserved"):
        s.load("result")
    assert s.salvage_reply_to("faas.n1.request.f$n.dev1.r4") == ("dev1", "r4")
    assert s.salvage_reply_to("faas.n1.request.fib.dev1") is None


@pytest.mark.parametrize("topic", ["", "/a", "a/", "a//b", "a.b/c", "a b"])
def test_unmappable_topics(topic):
    with pytest.raises(InvalidSubject):
        from_mqtt(topic)


def test_a_name_seen_valid_stays_valid_and_a_bad_one_stays_refused():
    """check_token remembers names it accepted (the hot path checks the same few on every call)."""
    for _ in range(3):
        assert s.request("n1", "fib", "c", "r1") == "faas.n1.request.fib.c.r1"
        with pytest.raises(InvalidToken):
            s.request("n1", "fib\n", "c", "r1")
