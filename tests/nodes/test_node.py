"""One node against a real nats-server: direct and async invocation, bad input, K slots, loss,
durability of async calls, redelivery, and direct calls that fail fast."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
from nats.js.api import DiscardPolicy

from broker import codes
from nodes.settings import Timings
from broker import headers as H
from broker.codec import decode
from broker.control import control_request
from broker.errors import NodeUnavailable
from broker.messages import NodeConfiguration, PoolTelemetry, Rejection, Result
from broker.streams import async_stream, deadletter_stream, results_stream
from broker.subjects import Subjects
from nodes.intake import consumer_name
from nodes.worker import DEFAULT_POOL
from nodes.scheduler.base import SchedulingAlgorithm
from support import Collector, eventually, wait_until


@pytest.fixture
def user_functions(tmp_path_factory, monkeypatch):
    """A user module on PYTHONPATH, as a user would add their own functions: outside the node's
    data dir (the test's tmp_path), which is out of its workers' reach."""
    code = tmp_path_factory.mktemp("userfns")
    (code / "userfns.py").write_text(textwrap.dedent("""
        import time

        print("userfns imported")   # a module that prints when imported: its workers still become ready

        def chatty(payload: bytes) -> bytes:
            print("x" * int(payload))   # one line longer than a stream reader's 64 KiB limit
            print("chatty done")
            return b"ok"

        def explode(payload: bytes) -> bytes:
            raise RuntimeError("boom " + payload.decode())

        def vanish(payload: bytes) -> bytes:
            import os
            os._exit(3)   # takes its worker with it, every time: a poison task

        def shout(payload: bytes) -> bytes:
            return payload.upper() + b"!"

        def started(payload: bytes) -> bytes:
            print("started", payload.decode())   # the call is in its worker now (the node logs the line)
            time.sleep(float(payload))
            return b"done"

        def span(payload: bytes) -> bytes:
            start = time.time()
            time.sleep(float(payload))
            return f"{start} {time.time()}".encode()
        span.p2pfaas_concurrency = 64   # I/O-bound: one worker may run many
    """))
    monkeypatch.setenv("PYTHONPATH", f"{code}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(code))
    return [("explode", "userfns:explode"), ("shout", "userfns:shout"), ("span", "userfns:span"),
            ("chatty", "userfns:chatty"), ("vanish", "userfns:vanish"), ("started", "userfns:started")]


def spans(answers) -> list[tuple[float, float]]:
    return [tuple(map(float, a.output.split())) for a in answers]


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def results_of(node, fn: str, status: str = "200") -> float:
    return sum(s.value for m in node.metrics.results.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["fn"] == fn and s.labels["status"] == status)


def errors_of(node) -> dict[str, float]:
    return {s.labels["kind"]: s.value for m in node.metrics.errors.collect() for s in m.samples
            if s.name.endswith("_total")}


@pytest.mark.parametrize("runtime", ["process", "inprocess"])
async def test_direct_call_returns_output_and_p2pfaas_timings(node_factory, faas, runtime):
    async with node_factory(runtime=runtime):
        answer = await faas.invoke("n1", "fib", b"20", timeout_s=20)
    assert answer.status == 200 and answer.output == b"6765"
    assert answer.executed_by == "n1" and answer.scheduler == "NoScheduler"
    assert answer.headers[H.TIMING_TOTAL].startswith("[") and not answer.externally_executed
    t = answer.timings
    assert t.execution_s > 0 and t.total_s >= t.execution_s
    assert t.total_s >= t.scheduling_s + t.queueing_s
    assert t.scheduling_s < 0.1  # the time spent deciding, not the transit (reported apart)


async def test_async_call_is_stored_answered_and_fetchable_later(node_factory, faas):
    async with node_factory():
        answer = await faas.call_async("n1", "fib", b"15", req="stored1", timeout_s=20)
        direct = await faas.invoke("n1", "echo", b"not kept", req="direct1", timeout_s=20)
    assert answer.status == 200 and answer.output == b"610" and answer.executed_by == "n1"
    stored = await faas.stored_answer("dev1", "stored1")
    assert stored is not None and stored.output == b"610"
    assert direct.status == 200 and await faas.stored_answer("dev1", "direct1") is None  # direct: nothing stored
    assert await faas.stored_answer("dev1", "never") is None


@pytest.mark.parametrize("kind", ["direct", "async"])
async def test_calls_dispatched_together_may_exceed_one_message(node_factory, faas, nc, kind):
    """Large inputs dispatched to one worker in the same turn go in as many messages as they need
    (and their outputs come back the same way): three 3 MiB echoes on an 8 MiB broker. Sent as one
    batch, the dispatch was refused by the client (MaxPayloadError) and every call in it lost."""
    assert nc.max_payload <= 8 * 1024 * 1024
    size = 3 * 1024 * 1024
    payloads = [bytes([65 + i]) * size for i in range(3)]
    async with node_factory(k=4, queue=4, max_payload_bytes=4 * 1024 * 1024):
        if kind == "direct":
            answers = await asyncio.gather(*(faas.invoke("n1", "echo", p, timeout_s=30) for p in payloads))
        else:
            answers = await asyncio.gather(*(faas.call_async("n1", "echo", p, req=f"big{i}", timeout_s=30)
                                             for i, p in enumerate(payloads)))
    assert [a.status for a in answers] == [200, 200, 200], [a.message for a in answers]
    assert [a.output for a in answers] == payloads


async def test_user_function_and_errors_keep_node_serving(node_factory, faas, user_functions):
    async with node_factory(functions=user_functions, max_payload_bytes=1000) as node:
        assert (await faas.invoke("n1", "shout", b"hey", timeout_s=20)).output == b"HEY!"
        cases = {
            "unknown function": (("nope", b"1"), 404, codes.NOT_FOUND),
            "empty payload": (("fib", b""), 400, codes.INPUT_NOT_VALID),
            "oversized payload": (("echo", b"x" * 1001), 413, codes.INPUT_NOT_VALID),
            "malformed input": (("fib", b"abc"), 400, codes.INPUT_NOT_VALID),
            "function raises": (("explode", b"now"), 500, codes.GENERIC),
        }
        for name, ((fn, payload), status, code) in cases.items():
            answer = await faas.invoke("n1", fn, payload, timeout_s=20)
            assert answer.status == status and answer.code == code, name
            assert answer.message, name
            if name == "malformed input":   # the function named once
                assert answer.message == "fib: expected a number, got b'abc'", answer.message
        async_answer = await faas.call_async("n1", "nope", b"1", timeout_s=20)   # the same over the async path
        assert async_answer.status == 404 and "unknown function" in async_answer.message
        timeout = await faas.invoke("n1", "sleep", b"5", headers={H.TIMEOUT: "0.3"}, timeout_s=20)
        assert timeout.status == 504 and "timeout" in timeout.message
        # still serving after all of that (the timed-out worker was recycled)
        assert (await faas.invoke("n1", "fib", b"10", timeout_s=20)).output == b"55"
        errors = errors_of(node)
    assert errors["unknown_function"] == 2 and errors["empty_payload"] == 1 and errors["too_large"] == 1
    assert errors["timeout"] == 1 and errors["function_error"] == 1 and errors["bad_input"] == 1


@pytest.mark.parametrize("header, value", [(H.TIMEOUT, "abc"), (H.TIMEOUT, "-1"), (H.DEADLINE, "nan"),
                                           (H.TASK_TYPE, "x"), (H.HOPS, "abc"), (H.WAIT, "0"), (H.WAIT, "abc")])
async def test_garbled_headers_are_refused_and_the_node_keeps_serving(node_factory, faas, nc, prefix, header, value):
    s = Subjects(prefix)
    async with node_factory() as node:
        answer = await faas.invoke("n1", "echo", b"x", headers={header: value}, timeout_s=10)
        forwarded = await nc.request(s.forward("n1", "echo", "dev1", "f1"), b"x", headers={header: value}, timeout=10)
        assert (await faas.invoke("n1", "echo", b"ok", timeout_s=10)).output == b"ok"
        bad_input = errors_of(node)["bad_input"]
    if header != H.HOPS:  # hops only count on a forward
        assert answer.status == 400 and header in answer.message
    assert forwarded.headers[H.STATUS] == "400" and header.encode() in forwarded.data
    assert bad_input >= 1


async def test_malformed_subjects_get_a_clear_rejection(node_factory, nc, prefix):
    s = Subjects(prefix)
    js = nc.jetstream()
    async with Collector(nc, f"{prefix}.reject.>") as answers, node_factory():
        await js.publish(f"{prefix}.async.n1.fib.dev1", b"1")                   # too few tokens
        await js.publish(f"{prefix}.async.n1.f=b.dev1.r7", b"1")                # bad function token
        direct = await nc.request(f"{prefix}.n1.request.f=b.dev1.r8", b"1", timeout=10)
        await wait_until(lambda: len(answers.messages) >= 2)
    by_subject = {m.subject: decode(Rejection, m.data) for m in answers.messages}
    assert by_subject[s.invalid()].code == codes.INPUT_NOT_VALID
    assert "function" in by_subject[s.reject("dev1", "r7")].reason
    assert direct.headers[H.STATUS] == "400" and b"function" in direct.data


async def test_at_most_k_concurrent_executions(node_factory, faas, user_functions):
    async with node_factory(k=2, queue=20, functions=user_functions):
        answers = await asyncio.gather(*(faas.invoke("n1", "span", b"0.3", timeout_s=30) for _ in range(7)))
    assert all(a.status == 200 for a in answers)
    assert peak_overlap(spans(answers)) == 2  # never more than K, and K really run in parallel


async def test_concurrent_function_shares_a_worker_cpu_bound_does_not(node_factory, faas, user_functions):
    async with node_factory(k=4, queue=20, functions=user_functions, runtime="process") as node:
        await node.pool.set_size(1)   # one worker process, four slots
        node.pool.target = 1
        await wait_until(lambda: node.pool.ready == 1)
        io = await asyncio.gather(*(faas.invoke("n1", "span", b"0.3", timeout_s=30) for _ in range(4)))
        cpu = await asyncio.gather(*(faas.invoke("n1", "busy", b"150", timeout_s=30) for _ in range(2)))
    assert peak_overlap(spans(io)) == 4     # an I/O-bound function: one process runs K calls at once
    assert all(a.status == 200 for a in cpu)
    first, second = sorted(a.timings.queueing_s for a in cpu)
    assert second >= 0.1                    # a CPU-bound one waits for the whole worker


async def test_what_functions_print_goes_to_the_log_and_never_blocks_their_worker(node_factory, faas, user_functions,
                                                                                    caplog):
    """A function that prints more than a pipe holds (80 KiB a call, in a line beyond a stream
    reader's limit) runs on: its worker's output is read as it comes and logged line by line
    (before, the worker blocked in ``print`` once the pipe was full and its calls overran)."""
    caplog.set_level(logging.INFO, logger="functions.output")
    logged = lambda text: [r.getMessage() for r in caplog.records if r.name == "functions.output" and text in r.getMessage()]  # noqa: E731
    async with node_factory(k=1, queue=20, functions=user_functions, runtime="process") as node:
        assert len(node.pool.workers) == 1
        answers = [await faas.invoke("n1", "chatty", b"81920", timeout_s=10) for _ in range(8)]   # 640 KiB in all
        await wait_until(lambda: len(logged("chatty done")) == 8, timeout_s=10)
    assert [a.status for a in answers] == [200] * 8 and {a.output for a in answers} == {b"ok"}
    assert logged("userfns imported")                     # printed at import, before READY
    long_lines = logged("more bytes]")
    # each line tagged with its function (functions/output.py): "[fn chatty] " is 12 bytes more
    assert len(long_lines) == 8 and all(m.startswith("n1-w1: [fn chatty] xxx") and "[77836 more bytes]" in m
                                        for m in long_lines), long_lines[:1]
    assert not any("[fn " in m for m in logged("userfns imported"))   # printed outside any call: untagged


async def test_a_worker_that_lost_its_subscription_is_replaced_not_left_ready(node_factory, faas, caplog):
    """A worker whose broker connection is gone while it runs (nats-server has nobody on its
    subject) gets no more calls and is replaced: before, it still counted as ready, and a pool of
    such workers held every call queued for ever, with nothing in the log."""
    async with node_factory(k=1, queue=4, runtime="inprocess") as node:
        first = node.pool.workers[0]
        assert (await faas.invoke("n1", "echo", b"a", timeout_s=10)).status == 200
        await first.worker.nc.close()                   # its subscription is gone; it still "runs"
        answer = await faas.invoke("n1", "echo", b"b", timeout_s=20)
        await wait_until(lambda: node.pool.ready == 1 and first not in node.pool.workers, timeout_s=20)
    assert answer.status == 200 and answer.output == b"b"
    assert any("nobody listens on the subject of worker n1-w1" in r.getMessage() for r in caplog.records)


async def test_noscheduler_loss_rejects_when_slots_and_queue_full(node_factory, faas):
    async with node_factory(k=1, queue=1):
        answers = await asyncio.gather(*(faas.invoke("n1", "sleep", b"0.5", timeout_s=30) for _ in range(5)))
    statuses = sorted(a.status for a in answers)
    assert statuses == [200, 200, 500, 500, 500]   # P2PFaaS: the job cannot be scheduled
    rejection = next(a for a in answers if a.status == 500)
    assert rejection.code == codes.CANNOT_SCHEDULE and rejection.retry_after_s and rejection.scheduler == "NoScheduler"


async def test_calls_whose_callers_stopped_waiting_are_not_run(node_factory, faas, nc, prefix):
    """A direct call still queued when its caller has given up (FaasClient's timeout, sent as
    X-P2pfaas-Wait-Seconds) is taken out of the queue unrun: run, it would hold the slot the
    callers who still wait need. The one already running finishes. Pool telemetry counts the
    calls not run as tasks that missed their QoS (not as tasks that never ended)."""
    s = Subjects(prefix)
    async with node_factory(k=1, queue=20, scheduler=("NoScheduler", ["false"])) as node, \
            Collector(nc, s.telemetry("n1", DEFAULT_POOL)) as telemetry:
        running = asyncio.create_task(faas.invoke("n1", "sleep", b"2.0", timeout_s=30))
        await wait_until(lambda: node.scheduler.main.n_running == 1, 10)
        impatient = [asyncio.create_task(faas.invoke("n1", "sleep", b"1.0", timeout_s=0.3)) for _ in range(3)]
        # a caller may also say how long it waits itself (the HTTP bridge passes the header on)
        own = asyncio.create_task(nc.request(s.request("n1", "sleep", "dev1", "w1"), b"1.0",
                                             headers={H.WAIT: "0.3"}, timeout=10))
        patient = asyncio.create_task(faas.invoke("n1", "sleep", b"0.1", timeout_s=30))
        for call in impatient:
            with pytest.raises(asyncio.TimeoutError):
                await call
        await wait_until(lambda: node.scheduler.main.n_queued == 1, 3)   # a sweep, before the slot frees
        first, last, told = await asyncio.gather(running, patient, own)
        gone = errors_of(node).get("caller_gone")

        def completed() -> int:
            return sum(decode(PoolTelemetry, m.data).completed for m in telemetry.messages)
        await wait_until(lambda: completed() >= 6, 5)
    assert (first.status, last.status) == (200, 200)
    assert last.timings.queueing_s < 3.5   # behind the running call only, not behind 4 s of abandoned ones
    assert told.headers[H.STATUS] == "504" and b"stopped waiting" in told.data
    assert results_of(node, "sleep") == 2 and gone == 4 and completed() == 6


async def test_calls_not_run_are_logged_in_a_summary_line_that_always_comes(node_factory, faas, caplog):
    """A summary line per window, not a line per call; calls dropped inside a window are said at
    its end (not only when another one is dropped later)."""
    caplog.set_level(logging.WARNING, logger="nodes.node")

    def said() -> int:
        lines = [r.getMessage() for r in caplog.records if "not run in the last" in r.getMessage()]
        assert all("caller_gone" in line for line in lines), lines
        return sum(int(line.split()[1]) for line in lines)
    async with node_factory(k=1, queue=20, scheduler=("NoScheduler", ["false"]),
                            timings=Timings(dropped_log_every_s=0.6)) as node:
        running = asyncio.create_task(faas.invoke("n1", "sleep", b"2.5", timeout_s=30))
        await wait_until(lambda: node.scheduler.main.n_running == 1, 10)
        for _ in range(4):   # given up one after the other: dropped by several sweeps
            with pytest.raises(asyncio.TimeoutError):
                await faas.invoke("n1", "sleep", b"1", timeout_s=0.2)
        await wait_until(lambda: errors_of(node).get("caller_gone") == 4, 3)
        await wait_until(lambda: said() == 4, 2)   # the last ones too, when their window ends
        assert (await running).status == 200
    assert said() == 4


async def test_a_call_that_would_end_after_its_caller_gave_up_is_told_so_at_once(node_factory, faas):
    """When a slot frees, a queued call with less of its caller's wait left than the function's
    recent execution time is not started: its caller gets 504 now, not a timeout later.
    (Under overload a FIFO queue otherwise settles where every call starts just before its
    caller gives up and ends after it: bench/overload.py.)"""
    async with node_factory(k=1, queue=20, scheduler=("NoScheduler", ["false"])) as node:
        assert (await faas.invoke("n1", "sleep", b"0.6", timeout_s=30)).status == 200   # sleep 0.6 takes ~0.6 s
        await wait_until(lambda: node.scheduler.main.n_running == 0, 5)   # its outcome may come after its answer
        busy = asyncio.create_task(faas.invoke("n1", "sleep", b"0.6", timeout_s=30))
        await wait_until(lambda: node.scheduler.main.n_running == 1, 10)
        started = time.monotonic()
        late = await faas.invoke("n1", "sleep", b"0.6", timeout_s=1.0)   # ~0.4 s left when the slot frees
        told_after = time.monotonic() - started
        assert (await busy).status == 200
        kinds = errors_of(node)
    assert late.status == 504 and "would end after its caller stops waiting" in late.message, late.message
    assert told_after < 0.95 and kinds.get("too_late") == 1 and results_of(node, "sleep") == 2


async def test_one_long_run_does_not_make_every_short_call_too_late(node_factory, faas):
    """The estimate of a function's execution time is the median of its last runs: after one long
    run (a large input) short calls with short waits still run, queued or not."""
    async with node_factory(k=1, queue=20, scheduler=("NoScheduler", ["false"])) as node:
        for _ in range(3):
            assert (await faas.invoke("n1", "sleep", b"0.05", timeout_s=30)).status == 200
        assert (await faas.invoke("n1", "sleep", b"4", timeout_s=30)).status == 200
        await wait_until(lambda: node.scheduler.main.n_running == 0, 5)
        answers = await asyncio.gather(*(faas.invoke("n1", "sleep", b"0.05", timeout_s=0.4) for _ in range(3)))
        kinds = errors_of(node)
    assert [a.status for a in answers] == [200] * 3 and "too_late" not in kinds, [a.message for a in answers]


async def test_queue_disabled_rejects_beyond_k(node_factory, faas):
    async with node_factory(k=2, queue=5, queue_enabled=False):
        answers = await asyncio.gather(*(faas.invoke("n1", "sleep", b"0.4", timeout_s=30) for _ in range(4)))
    assert sorted(a.status for a in answers) == [200, 200, 500, 500]
    assert {a.code for a in answers if a.status == 500} == {codes.CANNOT_SCHEDULE}


async def test_reject_and_bypass_headers(node_factory, faas):
    async with node_factory(k=1, queue=0, scheduler=("NoScheduler", ["false"])):
        rejected = await faas.invoke("n1", "echo", b"x", headers={H.REJECT: "true"}, timeout_s=20)
        bypassed = await faas.invoke("n1", "echo", b"y", headers={H.BYPASS: "true"}, timeout_s=20)
    assert rejected.status == 503 and rejected.code == 401
    assert bypassed.status == 200 and bypassed.output == b"y"


class _Raising(SchedulingAlgorithm):
    """An algorithm with a bug: it raises instead of deciding, after a probe's worth of waiting."""

    @classmethod
    def from_parameters(cls, parameters):
        return cls()

    def parameters(self):
        return []

    async def schedule(self, request, view):
        await asyncio.sleep(0.01)
        raise KeyError("n9")


class _RaisingAtOnce(_Raising):
    """The same bug in an algorithm decided right in the message callback."""

    instant = True

    async def schedule(self, request, view):
        raise KeyError("n9")


_Raising.name, _RaisingAtOnce.name = "TestRaising", "TestRaisingAtOnce"   # set afterwards: not registered for good


@pytest.mark.parametrize("algorithm", [_Raising, _RaisingAtOnce])
async def test_an_algorithm_that_raises_refuses_the_call_at_once(node_factory, faas, monkeypatch, algorithm):
    """A direct call waited for its caller's timeout, and an async one was held (kept alive) for ever."""
    monkeypatch.setitem(SchedulingAlgorithm.registry, algorithm.name, algorithm)
    async with node_factory(k=1, queue=1, scheduler=(algorithm.name, [])) as node:
        started = time.monotonic()
        direct = await faas.invoke("n1", "echo", b"x", timeout_s=10)
        stored = await faas.call_async("n1", "echo", b"y", timeout_s=10)
        waited = time.monotonic() - started
        await wait_until(lambda: not node.ingress.intake.held, 5)
        errors = errors_of(node)
    for answer in (direct, stored):
        assert answer.status == 500 and answer.code == codes.CANNOT_SCHEDULE, answer
        assert f"scheduler {algorithm.name}() failed to decide: KeyError" in answer.message
    assert waited < 5 and errors.get("scheduler_failed") == 2


async def test_configuration_changes_k_at_run_time_and_persists(node_factory, nc, faas, prefix, tmp_path,
                                                                user_functions):
    s = Subjects(prefix)
    async with node_factory(k=1, queue=10, data_dir=tmp_path, functions=user_functions) as node:
        reply = await nc.request(s.config("n1", "set"), b'{"parallel_running_functions_max": 3, "queue_length_max": 10}', timeout=5)
        assert reply.headers["X-P2pfaas-Status"] == "200"
        await node.pool.wait_ready(30)
        assert node.pool.ready == 3
        answers = await asyncio.gather(*(faas.invoke("n1", "span", b"0.4", timeout_s=30) for _ in range(3)))
        starts = [start for start, _ in spans(answers)]
        assert max(starts) - min(starts) < 0.35  # all three started together: K really is 3
        bad = await nc.request(s.config("n1", "set"), b'{"parallel_running_functions_max": "many"', timeout=5)
        assert bad.headers["X-P2pfaas-Status"] == "400" and b"not valid JSON" in bad.data
        assert bad.headers["Nats-Service-Error-Code"] == "400"
        bad = await nc.request(s.config("n1", "set"), b'{"parallel_running_functions_max": 0}', timeout=5)
        assert bad.headers["X-P2pfaas-Status"] == "400"
    async with node_factory(k=1, queue=10, data_dir=tmp_path) as node:  # restart: K=3 was persisted
        reply = await nc.request(s.config("n1", "get"), b"", timeout=5)
        assert decode(NodeConfiguration, reply.data).parallel_running_functions_max == 3
        assert node.pool.target == 3


async def test_async_call_published_while_node_down_runs_after_start(node_factory, faas, tmp_path):
    async with node_factory(data_dir=tmp_path):
        pass  # streams exist now; the node is down below
    fut = faas.expect("while-down")
    await faas.submit("n1", "fib", b"15", "while-down")
    await faas.submit("n1", "fib", b"15", "while-down")  # duplicate id: deduplicated
    assert not fut.done()
    async with node_factory(data_dir=tmp_path) as node:
        answer = await asyncio.wait_for(fut, 20)
        assert results_of(node, "fib") == 1
    assert answer.output == b"610"


async def test_worker_killed_mid_task_async_call_runs_again_exactly_one_result(node_factory, nc, faas, prefix,
                                                                                  user_functions, caplog):
    s = Subjects(prefix)
    caplog.set_level(logging.INFO, logger="functions.output")
    async with Collector(nc, s.result("dev1", "kill1")) as results, \
            node_factory(k=1, queue=5, runtime="process", functions=user_functions) as node:
        await faas.submit("n1", "started", b"1.0", "kill1")
        # killed once its worker runs the call: killed before the call reached it, the broker has
        # nobody on its subject and the call goes to the next worker unrun (no loss to see)
        await wait_until(lambda: any(r.name == "functions.output" and "started 1.0" in r.getMessage()
                                     for r in caplog.records), timeout_s=10)
        victim = node.pool.workers[0]
        os.kill(victim.proc.pid, signal.SIGKILL)
        await wait_until(lambda: len(results.messages) >= 1, timeout_s=20)
        await asyncio.sleep(1.5)  # the window in which a duplicate would show up
        lost = errors_of(node).get("worker_lost", 0)
    assert lost == 1  # it really ran twice: lost with its worker, then delivered again
    assert len(results.messages) == 1
    result = decode(Result, results.messages[0].data)
    assert result.status == 200 and result.executed_by == "n1"


@pytest.mark.parametrize("lose", ["call", "outcome"])
async def test_a_call_or_outcome_lost_in_transit_is_found_without_waiting_for_the_timeout(node_factory, faas, nc,
                                                                                          prefix, monkeypatch, lose):
    """The node stayed connected, but its message to a worker (or the worker's outcome) was lost
    with the worker's NATS server (a cluster server dying with it in its buffers; the worker
    reconnects elsewhere). Calls running long are checked with their workers: the lost one is
    found and delivered again -- not held, its intake message kept alive, for the function's
    timeout (an hour for sleep)."""
    from nodes import worker
    dropped: list[bytes] = []
    if lose == "call":
        on_calls = worker.Worker._on_calls

        def lossy_calls(self, subject, reply, data, headers):
            if not dropped and b'"sleep"' in data:
                dropped.append(data)   # never reached the worker
                return
            on_calls(self, subject, reply, data, headers)
        monkeypatch.setattr(worker.Worker, "_on_calls", lossy_calls)
    else:
        send = worker.Worker._send_outcomes

        def lossy_outcome(self, reply, outcomes, outputs, error=None):
            if not dropped and outcomes and outcomes[0]["status"] == 200:
                dropped.append(b"outcome")   # never reached the node
                return
            send(self, reply, outcomes, outputs, error)
        monkeypatch.setattr(worker.Worker, "_send_outcomes", lossy_outcome)
    async with Collector(nc, Subjects(prefix).result("dev1", "lost1")) as results, \
            node_factory(k=1, queue=5, runtime="inprocess", timings=Timings(worker_check_after_s=0.5)) as node:
        await faas.submit("n1", "sleep", b"0.2", "lost1")
        await wait_until(lambda: len(results.messages) >= 1, timeout_s=15)   # sleep's timeout is an hour
        await asyncio.sleep(0.5)  # no second answer
        ran, lost = results_of(node, "sleep"), errors_of(node).get("worker_lost", 0)
    assert dropped and len(results.messages) == 1 and decode(Result, results.messages[0].data).status == 200
    assert ran == 1 and lost == (1 if lose == "call" else 0)   # a lost call runs again; a lost outcome is sent again


async def test_a_task_that_kills_its_worker_every_time_is_dead_lettered_and_answered_once(node_factory, faas, nc,
                                                                                         prefix, user_functions):
    """A poison task runs max_deliver - 1 times (its worker dies each time), then its last delivery
    is not run: it is kept in the dead-letter stream with its cause and its caller gets 500."""
    s = Subjects(prefix)
    async with Collector(nc, s.result("dev1", "poison")) as results, \
            node_factory(k=1, queue=5, runtime="process", functions=user_functions, max_deliver=3) as node:
        await faas.submit("n1", "vanish", b"", "poison")
        await wait_until(lambda: len(results.messages) >= 1, timeout_s=40)
        await asyncio.sleep(1.5)  # the window in which a second answer would show up
        assert errors_of(node).get("worker_lost") == 2 and errors_of(node).get("dead_letter") == 1
        assert len(results.messages) == 1
        result = decode(Result, results.messages[0].data)
        assert result.status == 500 and "dead-lettered" in result.error and "delivered 3 times" in result.error
        kept = await nc.jetstream().get_last_msg(deadletter_stream(s), s.deadletter("n1", "vanish"))
        assert "delivered 3 times" in kept.headers[H.DEAD_LETTER_REASON]
        await node.pool.wait_ready(30)   # the pool is whole again (raises if not)


async def test_a_call_whose_deliveries_were_lost_in_transit_is_still_answered(node_factory, faas, nc, prefix, tmp_path):
    """Deliveries that never reached the node (sent while it reconnected to another server of a
    cluster) count at nats-server like any other. With the limit kept there, a call whose deliveries
    were used up that way was never delivered again: it stayed in the stream, unrun and unanswered,
    /result "pending" for ever (seen once in the compose test, a NATS server killed under load).
    The node counts the deliveries itself: the call comes again and is answered (dead-lettered, 500)."""
    s = Subjects(prefix)
    settings = dict(data_dir=tmp_path, ack_wait_s=1.0, max_deliver=3)
    async with node_factory(**settings):
        pass   # its streams and its durable consumer exist; the node is down below
    answer = faas.expect("in-transit")
    await faas.submit("n1", "echo", b"x", "in-transit")
    stolen = await nc.jetstream().pull_subscribe_bind(durable=consumer_name("n1"), stream=async_stream(s))
    for delivery in range(1, 4):   # delivered, never acknowledged: as if lost on the way
        [msg] = await stolen.fetch(1, timeout=5)
        assert msg.metadata.num_delivered == delivery
    await stolen.unsubscribe()
    async with node_factory(**settings):
        got = await asyncio.wait_for(answer, 20)
    assert got.status == 500 and "dead-lettered" in got.message and "deliveries were lost" in got.message, got


async def test_worker_killed_mid_task_direct_call_fails_at_once(node_factory, faas):
    async with node_factory(k=1, queue=5, runtime="process") as node:
        call = asyncio.create_task(faas.invoke("n1", "sleep", b"5", timeout_s=30))
        await wait_until(lambda: node.scheduler.main.n_running == 1, timeout_s=10)
        started = time.monotonic()
        os.kill(node.pool.workers[0].proc.pid, signal.SIGKILL)
        answer = await call
        assert time.monotonic() - started < 3
        assert answer.status == 500 and "died" in answer.message
        assert (await faas.invoke("n1", "echo", b"after", timeout_s=20)).output == b"after"  # replaced


async def test_load_probe_reports_running_and_queued(node_factory, nc, faas, prefix):
    s = Subjects(prefix)
    async with node_factory(k=1, queue=5) as node:
        calls = [asyncio.create_task(faas.invoke("n1", "sleep", b"0.6", timeout_s=30)) for _ in range(3)]
        main = node.scheduler.main
        await wait_until(lambda: main.n_running == 1 and main.n_queued == 2)
        load = orjson.loads((await nc.request(s.load("n1"), b"", timeout=5)).data)
        assert (load["running"], load["queued"], load["parallel_running_functions_max"]) == (1, 2, 1)
        await asyncio.gather(*calls)
        await wait_until(lambda: main.n_running == 0 and main.n_queued == 0)


async def test_long_async_task_outlives_ack_wait_without_redelivery(node_factory, faas):
    async with node_factory(k=2, ack_wait_s=0.5, runtime="inprocess") as node:
        answer = await faas.call_async("n1", "sleep", b"1.6", timeout_s=20)  # > 3 ack_wait periods
        await asyncio.sleep(0.6)   # a redelivery would start a second run within an ack_wait
        runs = results_of(node, "sleep") + node.scheduler.main.n_running
    assert answer.status == 200
    assert runs == 1  # the keep-alive held the message: it never ran twice


async def test_direct_call_to_a_node_that_is_not_running_fails_at_once(faas):
    started = time.monotonic()
    with pytest.raises(NodeUnavailable, match="not running"):
        await faas.invoke("nowhere", "echo", b"x", timeout_s=30)
    assert time.monotonic() - started < 2


async def test_node_process_killed_mid_call_fails_the_direct_call_at_once(nats_server, faas, prefix, tmp_path):
    """kill -9 of a node: its orphaned workers say so, the caller fails now, not at its timeout."""
    env = dict(os.environ, P2PFAAS_NODE_ID="n7", P2PFAAS_NATS_URL=nats_server.url, P2PFAAS_PREFIX=prefix,
               P2PFAAS_DATA_DIR=str(tmp_path))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "p2pfaas.cli", "node", env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        async def up() -> bool:
            try:
                return (await faas.invoke("n7", "echo", b"?", timeout_s=2)).status == 200
            except (NodeUnavailable, asyncio.TimeoutError):
                return False

        await eventually(up, bool, timeout_s=60, interval_s=0.3)   # the node came up
        call = asyncio.create_task(faas.invoke("n7", "sleep", b"20", timeout_s=60))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        with pytest.raises(NodeUnavailable, match="went away"):
            await call
        assert time.monotonic() - started < 5
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_an_answer_jetstream_refuses_is_kept_and_reported_until_stored(node_factory, faas, nc, prefix):
    """The answers stream refuses writes (as on a full disk): the async task's answer waits in the
    node (a live subscriber may already have it: the publish reaches subscribers even when the
    stream refuses it), its health info says so (the bridge's /healthz answers 503), and once the
    stream takes writes again the answer is stored -- the task is not run a second time."""
    js, s = nc.jetstream(), Subjects(prefix)
    async with node_factory() as node:
        assert (await faas.call_async("n1", "echo", b"first", req="first", timeout_s=20)).status == 200
        info = await js.stream_info(results_stream(s))
        config, original = info.config, (info.config.max_msgs, info.config.discard)
        config.max_msgs, config.discard = info.state.messages, DiscardPolicy.NEW   # full: refuses new answers
        await js.update_stream(config)
        answering = asyncio.create_task(faas.call_async("n1", "echo", b"held", req="held", timeout_s=60))
        await wait_until(lambda: node.scheduler.answerer.unstored == 1, timeout_s=20)
        status, data = await control_request(nc, s.info("n1"), b"", 5.0)
        assert status == 200 and orjson.loads(data)["answers_unstored"] == 1
        assert await faas.stored_answer("dev1", "held") is None
        config.max_msgs, config.discard = original
        await js.update_stream(config)
        answer = await asyncio.wait_for(answering, 40)
        assert answer.status == 200 and answer.output == b"held"
        await wait_until(lambda: node.scheduler.answerer.unstored == 0, timeout_s=20)
        stored = await faas.stored_answer("dev1", "held")
        assert stored is not None and stored.output == b"held"
        executed = node.metrics.invocations("echo")
    assert executed == 2   # "first" and "held", each run once


async def test_a_call_without_reply_the_intake_cannot_store_is_rejected_to_its_client(node_factory, faas, nc, prefix):
    """A call published with no reply subject is stored as an async call; when the intake refuses
    it (full), its client hears so on its reject subject (503, retry), never silence."""
    from broker.streams import async_stream
    s, js = Subjects(prefix), nc.jetstream()
    async with node_factory(k=1, queue=4) as node:
        held = asyncio.create_task(faas.call_async("n1", "sleep", b"1.5", req="held", timeout_s=30))
        await wait_until(lambda: node.scheduler.main.n_running == 1, timeout_s=20)
        config = (await js.stream_info(async_stream(s))).config
        config.max_msgs = 1                      # the held call's message fills the intake
        await js.update_stream(config)
        async with Collector(nc, s.reject("dev1", "noreply")) as rejects:
            await nc.publish(s.request("n1", "echo", "dev1", "noreply"), b"x")   # no reply subject
            await asyncio.wait_for(rejects.event.wait(), 10)
        rejection = decode(Rejection, rejects.messages[0].data)
        assert rejection.http_status == 503 and "not stored" in rejection.reason and rejection.request_id == "noreply"
        assert errors_of(node).get("not_stored", 0) >= 1
        assert (await asyncio.wait_for(held, 30)).status == 200   # the call that was stored still runs


async def test_a_resize_during_a_workers_replacement_keeps_the_pool(node_factory):
    """A deploy replaces the workers (new ones start, the old ones stop once those are ready); a
    resize to the same size in between (the controller sends its target every period) used to
    count old and new together and retire the new ones: the deploy waited 60 s and left no worker."""
    async with node_factory(k=2, runtime="process") as node:
        pool = node.pool
        old = list(pool.workers)
        replacing = asyncio.create_task(pool.replace_workers(ready_timeout_s=30))
        await wait_until(lambda: len(pool.workers) == 4, timeout_s=5)   # the new ones are starting
        await pool.set_size(2)
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(replacing, 30) == 2
        waited = asyncio.get_running_loop().time() - started
        await wait_until(lambda: pool.ready == 2 and len(pool.workers) == 2, timeout_s=20)
    assert not set(old) & set(pool.workers) and waited < 20


async def test_workers_that_die_before_ready_are_started_again_with_a_backoff(node_factory, faas, user_functions,
                                                                               caplog):
    """A module that breaks (a syntax error deployed, say) makes every new worker die at start: they
    are started again after 0.5, 1, 2, 5, 10 s (before, at once, for ever: dozens a second), and
    once the module is fixed the pool is whole again."""
    async with node_factory(k=1, queue=4, functions=user_functions, runtime="process") as node:
        pool = node.pool
        module = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0]) / "userfns.py"   # user_functions put it there
        good = module.read_text()
        module.write_text(good + "\nthis is not python\n")
        before = next(pool._names)
        pool.kill(pool.workers[0].name)
        await asyncio.sleep(3.0)   # the window in which a respawn loop shows: 0.5 + 1 + (2) s of backoff
        spawned = next(pool._names) - before - 1
        assert 1 <= spawned <= 4, spawned
        assert any("died before they were ready" in r.getMessage() for r in caplog.records)
        module.write_text(good)
        await wait_until(lambda: pool.ready == 1, timeout_s=20)
        assert (await faas.invoke("n1", "shout", b"back", timeout_s=10)).output == b"BACK!"


async def test_an_inprocess_worker_retired_before_it_started_stops(node_factory):
    async with node_factory(k=2, runtime="inprocess") as node:
        await node.pool.set_size(3)
        await node.pool.set_size(2)   # the third is retired before its task ran
        await wait_until(lambda: len(node.pool.workers) == 2 and node.pool.ready == 2, timeout_s=10)


async def test_one_node_process_per_node_directory(node_factory, tmp_path):
    """A second node with the same id and data directory (``p2pfaas node`` started twice by hand)
    is refused, naming the holder: it would have ended the first one's workers as strays of a
    previous run. Once the first stops, the directory is free again."""
    from broker.errors import DataDirInUse
    from nodes.node import Node

    async with node_factory(k=1, data_dir=tmp_path) as first:
        second = Node(first.settings)
        with pytest.raises(DataDirInUse, match=f"in use by another node n1 \\(pid {os.getpid()}\\)"):
            await second.start()
        await second.stop()
        assert first.pool.ready == 1 and all(w.proc is None or w.proc.returncode is None for w in first.pool.workers)
    async with node_factory(k=1, data_dir=tmp_path) as again:
        assert again.pool.ready == 1


def test_settings_from_the_environment_take_user_functions(monkeypatch):
    """P2PFAAS_FUNCTIONS (documented in functions/registry.py) as --function takes them; an
    explicit argument still wins."""
    from nodes.settings import NodeSettings

    monkeypatch.setenv("P2PFAAS_FUNCTIONS", "shout=userfns:shout, span=userfns:span")
    assert NodeSettings().functions == [("shout", "userfns:shout"), ("span", "userfns:span")]
    assert NodeSettings(functions=[("x", "m:f")]).functions == [("x", "m:f")]
    monkeypatch.setenv("P2PFAAS_FUNCTIONS", "nonsense")
    with pytest.raises(ValueError, match="must look like name=package.module:function"):
        NodeSettings()


def test_every_node_setting_comes_from_the_environment_under_one_prefix(monkeypatch):
    """P2PFAAS_<FIELD> for every field (JSON for models), empty values ignored; explicit values
    win; a worker's copy of its node's settings is not read from its own environment."""
    from nodes.settings import NodeSettings

    monkeypatch.setenv("P2PFAAS_ACK_WAIT_S", "3")
    monkeypatch.setenv("P2PFAAS_SEEDS", "nats://a:1, nats://b:2")
    monkeypatch.setenv("P2PFAAS_INITIAL", '{"parallel_running_functions_max": 3}')
    monkeypatch.setenv("P2PFAAS_GROUP", "")
    settings = NodeSettings(node_id="n9")
    assert (settings.ack_wait_s, settings.seeds, settings.initial.parallel_running_functions_max, settings.group) \
        == (3.0, ["nats://a:1", "nats://b:2"], 3, "default")
    assert NodeSettings(ack_wait_s=5).ack_wait_s == 5
    monkeypatch.setenv("P2PFAAS_ACK_WAIT_S", "99")
    assert NodeSettings.model_validate_json(settings.model_dump_json()).ack_wait_s == 3.0
    monkeypatch.setenv("P2PFAAS_ACK_WAIT_S", "soon")
    with pytest.raises(ValueError, match="ack_wait_s"):
        NodeSettings()


async def test_the_control_plane_is_a_nats_service_that_tools_find(node_factory, nc, prefix):
    """A node's control subjects are the endpoints of the NATS service ``p2pfaas-node``: what `nats
    micro ls` and `nats micro info` read ($SRV.PING, $SRV.INFO), counting the requests served."""
    s = Subjects(prefix)
    async with node_factory():
        inbox = nc.new_inbox()
        pings: list[dict] = []

        async def on_ping(msg) -> None:
            pings.append(orjson.loads(msg.data))

        sub = await nc.subscribe(inbox, cb=on_ping)
        try:
            await nc.publish("$SRV.PING.p2pfaas-node", b"", reply=inbox)
            await wait_until(lambda: any(p["metadata"].get("prefix") == prefix for p in pings), 5)
        finally:
            await sub.unsubscribe()
        ours = next(p for p in pings if p["metadata"].get("prefix") == prefix)
        assert (ours["name"], ours["metadata"]["node"], ours["type"]) == ("p2pfaas-node", "n1", "io.nats.micro.v1.ping_response")
        assert (await nc.request(s.load("n1"), b"", timeout=5)).headers[H.STATUS] == "200"
        info = orjson.loads((await nc.request(f"$SRV.INFO.p2pfaas-node.{ours['id']}", b"", timeout=5)).data)
        subjects = {e["subject"] for e in info["endpoints"]}
        assert {s.load("n1"), s.info("n1"), s.config("n1", "set"), s.functions("n1", "deploy")} <= subjects
        stats = orjson.loads((await nc.request(f"$SRV.STATS.p2pfaas-node.{ours['id']}", b"", timeout=5)).data)
        load = next(e for e in stats["endpoints"] if e["subject"] == s.load("n1"))
        assert load["num_requests"] >= 1
