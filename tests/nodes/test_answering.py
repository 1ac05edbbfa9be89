"""An async call's stored answer, written out by the node without building the model (pure)."""

from __future__ import annotations

import orjson
import pytest

from broker import codes
from broker.codec import decode
from broker.messages import LearningDecision, Result
from broker.subjects import Subjects
from nodes.calls import result_document
from nodes.calls import Call
from nodes.scheduler.base import SchedulingRequest


def _call(*, forwarded: bool, learning: LearningDecision | None) -> Call:
    inv = Subjects("faas").parse_invocation("faas.async.n2.fib.app1.r7")
    request = SchedulingRequest(fn="fib", client="app1", request_id="r7", external=forwarded,
                                hops=2 if forwarded else 0, peers=("n0", "n1") if forwarded else ())
    call = Call(inv=inv, payload=b"25", request=request, arrival=1000.0, timeout_s=60.0, transit_s=0.002,
                waited_s=0.01, scheduler="PowerOfN(1, 2)", scheduled_at=1000.0125, probing_s=0.0005,
                dispatched_at=1000.02, learning=learning, peer_ips=("10.0.0.1",) if forwarded else ())
    return call


@pytest.mark.parametrize("forwarded", [False, True])
@pytest.mark.parametrize("status, output, error", [(200, b"75025", None), (200, b"\xff\x00", None),
                                                   (500, b"", "fib: boom")])
@pytest.mark.parametrize("learning", [None, LearningDecision(eid=3, state=[0.5, 1.0], action=1, eps=0.1)])
def test_the_document_is_the_contract(forwarded, status, output, error, learning):
    call = _call(forwarded=forwarded, learning=learning)
    doc = result_document(call, "n2", "10.0.0.2", status, error, 0.25, 0.3, output)
    assert list(doc) == list(Result.model_fields)        # every field, none more
    result = decode(Result, orjson.dumps(doc))           # valid as the contract
    assert result.model_dump(mode="json") == doc         # and nothing lost or changed on the way
    expected = Result(
        request_id="r7", client="app1", fn="fib", status=status, error=error, executed_by="n2",
        origin="n0" if forwarded else "n2", hops=2 if forwarded else 0,
        peers=["n0", "n1", "n2"] if forwarded else [], peer_ips=["10.0.0.1", "", "10.0.0.2"] if forwarded else [],
        scheduler="PowerOfN(1, 2)", timings=result.timings, hop_timings=result.hop_timings,
        finished_at=result.finished_at, learning=learning,
        **({"output_b64": "/wA="} if output == b"\xff\x00" else {"output": output.decode()}))
    assert result == expected
    assert result.timings.execution_s == 0.25 and result.timings.total_s == 0.3
    assert result.timings.scheduling_s == pytest.approx(0.0025) and result.timings.queueing_s == pytest.approx(0.0175)
    assert [h.node for h in result.hop_timings] == ["n2"] and result.hop_timings[0].probing_s == 0.0005


def _direct_call(rnd, *, plain: bool) -> Call:
    """A direct call with random timings: ``plain`` (not forwarded, not probed, no learning) or any."""
    forwarded = not plain and rnd.random() < 0.5
    inv = Subjects("faas").parse_invocation(f"faas.n2.{'forward' if forwarded else 'request'}.fib.app1.r7")
    request = SchedulingRequest(fn="fib", client="app1", request_id="r7", external=forwarded,
                                hops=rnd.randint(1, 3) if forwarded else 0, peers=("n0", "n1") if forwarded else ())
    arrival = 1_764_000_000 + rnd.random() * 1000
    scheduled = arrival + rnd.choice([0.0, 1e-7, rnd.random() * 0.01])
    learning = None if plain or rnd.random() < 0.5 else LearningDecision(eid=4, state=[0.5, 2.0], action=1, eps=0.25)
    return Call(inv=inv, payload=b"25", request=request, arrival=arrival, timeout_s=60.0, reply="_INBOX.a.1",
                transit_s=rnd.choice([0.0, 1e-9, rnd.random() * 0.002, 12.5]),
                scheduler=rnd.choice(["NoScheduler(false)", "PowerOfNScheduler(1, 2, true, 1)", "odd\r\nname "]),
                scheduled_at=scheduled, probing_s=0.0 if plain else rnd.choice([0.0, rnd.random() * 0.01]),
                dispatched_at=scheduled + rnd.choice([0.0, rnd.random()]), learning=learning,
                peer_ips=("10.0.0.1",) if forwarded else ())


@pytest.mark.parametrize("plain", [True, False])
def test_a_direct_answers_node_side_is_the_headers_of_the_contract(plain):
    """What the node hands the worker (rendered in one pass for a plain call) is exactly
    ``context_headers`` as nats-py would write them; the worker's block completes it into the
    headers ``answer_headers`` gives for that answer."""
    import random

    from broker.answers import answer_headers, context_headers, render_direct
    from broker.connection import header_text
    from broker.fastpath import NatsClient
    from broker.messages import DirectAnswer, HopTiming
    from nodes.answering import Answerer

    rnd = random.Random(11 if plain else 12)
    answerer = Answerer.__new__(Answerer)
    answerer.node, answerer.ip = "n2", "10.0.0.2"
    answerer._executed_by, answerer._plain_lines = header_text({"X-P2pfaas-Executed-By": "n2"}), {}
    for _ in range(400):
        call = _direct_call(rnd, plain=plain)
        forwarded = call.request.external
        peers = [*call.request.peers, "n2"] if forwarded else []
        ips = ["10.0.0.1", "", "10.0.0.2"] if forwarded else []
        expected = context_headers(scheduler=call.scheduler, executed_by="n2", scheduling=[call.scheduling_s],
                                   probing=[call.probing_s], queueing_s=call.queueing_s, transit_s=call.transit_s,
                                   forwards=call.request.hops if forwarded else 0, peers=peers, peer_ips=ips,
                                   learning=call.learning)
        doc = answerer.direct_context(call)
        assert doc["headers"] == header_text(expected)
        ctx = decode(DirectAnswer, orjson.dumps(doc))   # valid as the contract
        status = rnd.choice([200, 500])
        body, block = render_direct(ctx, status, b"out", "boom", 0.0125)
        parsed = NatsClient._parse_header_lines(block[len(b"NATS/1.0\r\n"):])
        total = orjson.loads(parsed["X-P2pfaas-Timing-Total-Seconds-List"])[0]
        assert total >= 0
        whole = answer_headers(status=status, scheduler=call.scheduler, executed_by="n2",
                               hops=[HopTiming(node="n2", arrival=call.arrival, scheduling_s=call.scheduling_s,
                                               probing_s=call.probing_s, total_s=total)],
                               execution_s=0.0125, queueing_s=call.queueing_s, transit_s=call.transit_s,
                               forwards=call.request.hops if forwarded else 0, peers=peers, peer_ips=ips,
                               learning=call.learning)
        assert parsed == {name: value.strip().replace("\r", " ").replace("\n", " ") for name, value in whole.items()}
        assert body == (b"out" if status == 200 else orjson.dumps({"code": codes.for_status(500), "message": "boom"}))
    assert not plain or answerer._plain_lines   # the plain path was taken


def test_the_calls_a_node_dispatches_are_the_contract():
    """The WorkerCalls document the dispatcher writes decodes into the contract, field by field."""
    import random

    from broker.codec import frame, unframe
    from broker.messages import WorkerCalls
    from nodes.calls import calls_document

    rnd = random.Random(5)
    calls = [_direct_call(rnd, plain=True) for _ in range(3)]
    contexts = {c.id: {"reply": f"_INBOX.x.{c.id}", "arrival": c.arrival, "headers": "A: b\r\n"} for c in calls[:2]}
    batch, payloads = unframe(WorkerCalls, frame(calls_document(calls, lambda c: contexts.get(c.id)), b"25" * 3))
    assert payloads == b"252525"
    assert [(w.fn, w.timeout_s, w.id, w.size) for w in batch.calls] == [("fib", 60.0, c.id, 2) for c in calls]
    assert [w.answer and w.answer.model_dump() for w in batch.calls] == [contexts[calls[0].id], contexts[calls[1].id], None]


async def test_a_batch_larger_than_a_message_goes_in_several():
    """Calls dispatched to one worker in one turn whose inputs do not fit one message leave as
    several, each within the broker's limit, on the batch's one reply subject (before, one message
    the client refused: every call in it lost). An in-memory connection: what would be sent."""
    import asyncio

    from broker.codec import unframe
    from broker.messages import WorkerCalls
    from functions.registry import default_registry
    from nodes.dispatch import Dispatcher
    from nodes.inbox import Inbox

    class Wire:
        max_payload = 400_000
        sent: list[tuple[str, bytes, str]] = []

        def send(self, subject, payload=b"", *, reply="", headers=b""):
            assert len(payload) + len(headers) <= self.max_payload
            self.sent.append((subject, payload, reply))

    class Unanswered:   # nothing ends in this test: the calls only leave
        def ended(self, *args) -> None: ...

        async def lost(self, *args) -> None: ...

        async def unrun(self, *args) -> None: ...

        def direct_context(self, call) -> None:
            return None

    wire = Wire()
    inbox = Inbox(wire)   # type: ignore[arg-type]
    dispatcher = Dispatcher("default", wire, Subjects("faas"), "n1", default_registry(), inbox,   # type: ignore[arg-type]
                            Unanswered(), slots=8)
    await dispatcher.add_worker("w1")
    calls = []
    for i in range(5):
        call = _call(forwarded=False, learning=None)
        call.inv = Subjects("faas").parse_invocation(f"faas.async.n1.echo.app1.r{i}")
        call.payload = bytes([65 + i]) * 120_000
        calls.append(call)
        dispatcher.submit(call)
    await asyncio.sleep(0)   # the end of the turn: the batch is sent
    messages = [(unframe(WorkerCalls, data), reply) for _, data, reply in wire.sent]
    assert len(messages) == 3 and len({reply for _, reply in messages}) == 1
    got = [(order.id, payloads) for (batch, payloads), _ in messages for order in batch.calls]
    assert [i for i, _ in got] == [c.id for c in calls]
    assert b"".join(p for (_, p), _ in messages) == b"".join(c.payload for c in calls)
    await dispatcher.lose_worker("w1", "the test is over")   # no overrun sweep left to fire in later tests
    assert dispatcher.n_running == 0
