"""An async call's stored answer, written out by the node without building the model (pure)."""

from __future__ import annotations

import orjson
import pytest

from broker.codec import decode
from broker.messages import LearningDecision, Result
from broker.subjects import Subjects
from nodes.answering import result_document
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
