"""One node against a real nats-server: invocation, bad input, K slots, loss, durability, redelivery."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap

import orjson
import pytest

from broker import headers as H
from broker.codec import decode
from broker.messages import NodeConfiguration, Rejection, Result
from broker.subjects import Subjects
from support import Collector, wait_until


@pytest.fixture
def user_functions(tmp_path, monkeypatch):
    """A user module on PYTHONPATH, as a user would add their own functions."""
    (tmp_path / "userfns.py").write_text(textwrap.dedent("""
        def explode(payload: bytes) -> bytes:
            raise RuntimeError("boom " + payload.decode())

        def shout(payload: bytes) -> bytes:
            return payload.upper() + b"!"
    """))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(tmp_path))
    return [("explode", "userfns:explode"), ("shout", "userfns:shout")]


@pytest.mark.parametrize("runtime", ["process", "inprocess"])
async def test_invoke_fib_returns_output_and_timings(node_factory, faas, runtime):
    async with node_factory(runtime=runtime):
        answer = await faas.invoke("n1", "fib", b"20", timeout_s=20)
    assert answer.status == 200 and answer.output == b"6765"
    res = answer.result
    assert res.executed_by == "n1" and res.scheduler == "NoScheduler(true)"
    t = res.timings
    assert t.execution_s > 0 and t.total_s >= t.execution_s
    assert t.total_s >= t.scheduling_s + t.queueing_s


async def test_user_function_and_errors_keep_node_serving(node_factory, faas, user_functions):
    async with node_factory(functions=user_functions, max_payload_bytes=1000) as node:
        assert (await faas.invoke("n1", "shout", b"hey", timeout_s=20)).output == b"HEY!"
        cases = {
            "unknown function": (("nope", b"1"), 404),
            "empty payload": (("fib", b""), 400),
            "oversized payload": (("echo", b"x" * 1001), 413),
            "malformed input": (("fib", b"abc"), 400),
            "function raises": (("explode", b"now"), 500),
        }
        for name, ((fn, payload), status) in cases.items():
            answer = await faas.invoke("n1", fn, payload, timeout_s=20)
            assert answer.status == status, name
            message = answer.rejection.reason if answer.rejection else answer.result.error
            assert message, name
        timeout = await faas.invoke("n1", "sleep", b"5", headers={H.TIMEOUT: "0.3"}, timeout_s=20)
        assert timeout.status == 504 and "timeout" in timeout.result.error
        # still serving after all of that (the timed-out worker was recycled)
        assert (await faas.invoke("n1", "fib", b"10", timeout_s=20)).output == b"55"
        errors = {s.labels["kind"]: s.value for m in node.metrics.errors.collect() for s in m.samples
                  if s.name.endswith("_total")}
    assert errors["unknown_function"] == 1 and errors["empty_payload"] == 1 and errors["too_large"] == 1
    await wait_until(lambda: True)
    assert errors.get("timeout", 0) + errors.get("function_error", 0) + errors.get("bad_input", 0) >= 2


async def test_malformed_subjects_get_a_clear_rejection(node_factory, nc, prefix):
    s = Subjects(prefix)
    js = nc.jetstream()
    async with Collector(nc, f"{prefix}.reject.>") as answers, node_factory():
        await js.publish(f"{prefix}.n1.request.fib.dev1", b"1")                 # too few tokens
        await js.publish(f"{prefix}.n1.request.f=b.dev1.r7", b"1")              # bad function token
        await wait_until(lambda: len(answers.messages) >= 2)
    by_subject = {m.subject: decode(Rejection, m.data) for m in answers.messages}
    assert by_subject[s.invalid()].code == 400
    assert "malformed" in by_subject[s.reject("dev1", "r7")].reason


async def test_at_most_k_concurrent_executions(node_factory, faas):
    async with node_factory(k=2, queue=20):
        answers = await asyncio.gather(*(faas.invoke("n1", "sleep", b"0.3", timeout_s=30) for _ in range(7)))
    assert all(a.status == 200 for a in answers)
    spans = [(a.result.finished_at - a.result.timings.execution_s, a.result.finished_at) for a in answers]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2  # never more than K, and K really run in parallel


async def test_noscheduler_loss_rejects_when_slots_and_queue_full(node_factory, faas):
    async with node_factory(k=1, queue=1):
        answers = await asyncio.gather(*(faas.invoke("n1", "sleep", b"0.5", timeout_s=30) for _ in range(5)))
    statuses = sorted(a.status for a in answers)
    assert statuses == [200, 200, 503, 503, 503]
    rejection = next(a.rejection for a in answers if a.rejection)
    assert rejection.code == 401 and rejection.retry_after_s and rejection.scheduler == "NoScheduler(true)"


async def test_queue_disabled_rejects_beyond_k(node_factory, faas):
    async with node_factory(k=2, queue=5, queue_enabled=False):
        answers = await asyncio.gather(*(faas.invoke("n1", "sleep", b"0.4", timeout_s=30) for _ in range(4)))
    assert sorted(a.status for a in answers) == [200, 200, 503, 503]


async def test_reject_and_bypass_headers(node_factory, faas):
    async with node_factory(k=1, queue=0, scheduler=("NoScheduler", ["false"])):
        rejected = await faas.invoke("n1", "echo", b"x", headers={H.REJECT: "true"}, timeout_s=20)
        bypassed = await faas.invoke("n1", "echo", b"y", headers={H.BYPASS: "true"}, timeout_s=20)
    assert rejected.status == 503 and rejected.rejection.code == 401
    assert bypassed.status == 200 and bypassed.output == b"y"


async def test_configuration_changes_k_at_run_time_and_persists(node_factory, nc, faas, prefix, tmp_path):
    s = Subjects(prefix)
    async with node_factory(k=1, queue=10, data_dir=tmp_path) as node:
        reply = await nc.request(s.config("n1", "set"), b'{"parallel_running_functions_max": 3, "queue_length_max": 10}', timeout=5)
        assert reply.headers["X-P2pfaas-Status"] == "200"
        await node.pool.wait_ready(30)
        assert node.pool.ready == 3
        answers = await asyncio.gather(*(faas.invoke("n1", "sleep", b"0.4", timeout_s=30) for _ in range(3)))
        starts = [a.result.finished_at - a.result.timings.execution_s for a in answers]
        assert max(starts) - min(starts) < 0.35  # all three started together: K really is 3
        bad = await nc.request(s.config("n1", "set"), b'{"parallel_running_functions_max": "many"', timeout=5)
        assert bad.headers["X-P2pfaas-Status"] == "400" and b"not valid JSON" in bad.data
        bad = await nc.request(s.config("n1", "set"), b'{"parallel_running_functions_max": 0}', timeout=5)
        assert bad.headers["X-P2pfaas-Status"] == "400"
    async with node_factory(k=1, queue=10, data_dir=tmp_path) as node:  # restart: K=3 was persisted
        reply = await nc.request(s.config("n1", "get"), b"", timeout=5)
        assert decode(NodeConfiguration, reply.data).parallel_running_functions_max == 3
        assert node.pool.target == 3


async def test_request_published_while_node_down_runs_after_start(node_factory, faas, tmp_path):
    async with node_factory(data_dir=tmp_path):
        pass  # streams exist now; the node is down below
    fut = faas.expect("while-down")
    await faas.submit("n1", "fib", b"15", "while-down")
    await faas.submit("n1", "fib", b"15", "while-down")  # duplicate id: deduplicated
    assert not fut.done()
    async with node_factory(data_dir=tmp_path):
        answer = await asyncio.wait_for(fut, 20)
    assert answer.output == b"610"


async def test_worker_killed_mid_task_is_redelivered_exactly_one_result(node_factory, nc, faas, prefix):
    s = Subjects(prefix)
    async with Collector(nc, s.result("dev1", "kill1")) as results, \
            Collector(nc, s.task_event("n1", "started")) as started, \
            node_factory(k=1, queue=5, ack_wait_s=1.0, runtime="process") as node:
        await faas.submit("n1", "sleep", b"1.0", "kill1")
        await asyncio.wait_for(started.event.wait(), 10)
        victim = node.pool.workers[0]
        os.kill(victim.proc.pid, signal.SIGKILL)
        await wait_until(lambda: len(results.messages) >= 1, timeout_s=20)
        await asyncio.sleep(1.5)  # the window in which a duplicate would show up
    assert len(started.messages) >= 2  # it really ran twice: killed, then redelivered
    assert len(results.messages) == 1
    result = decode(Result, results.messages[0].data)
    assert result.status == 200
    assert result.executed_by == "n1"


async def test_stored_result_can_be_fetched_later(node_factory, faas):
    async with node_factory():
        await faas.invoke("n1", "echo", b"keep", req="stored1", timeout_s=20)
    stored = await faas.stored_answer("dev1", "stored1")
    assert stored is not None and stored.output == b"keep"
    assert await faas.stored_answer("dev1", "never") is None


async def test_load_probe_reports_running_and_queued(node_factory, nc, faas, prefix):
    s = Subjects(prefix)
    async with node_factory(k=1, queue=5) as node:
        calls = [asyncio.create_task(faas.invoke("n1", "sleep", b"0.6", timeout_s=30)) for _ in range(3)]
        await wait_until(lambda: node.scheduler.load.n_running == 1 and node.scheduler.load.n_queued == 2)
        load = orjson.loads((await nc.request(s.load("n1"), b"", timeout=5)).data)
        assert (load["running"], load["queued"], load["parallel_running_functions_max"]) == (1, 2, 1)
        await asyncio.gather(*calls)
        await wait_until(lambda: node.scheduler.load.n_running == 0 and node.scheduler.load.n_queued == 0)


async def test_long_task_outlives_ack_wait_without_redelivery(node_factory, nc, faas, prefix):
    s = Subjects(prefix)
    async with Collector(nc, s.task_event("n1", "started")) as started, \
            node_factory(k=2, ack_wait_s=0.5, runtime="inprocess"):
        answer = await faas.invoke("n1", "sleep", b"1.6", timeout_s=20)  # > 3 ack_wait periods
    assert answer.status == 200
    assert len(started.messages) == 1  # the keep-alive held the task: it never ran twice
