"""Accepted async work waits for a slot: a burst far beyond K slots + queue is held in the stream
and drained, every call answered once, none refused for overload; direct calls keep being
admitted (and refused) by P2PFaaS's rules meanwhile."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.codec import decode
from broker.lifecycle import still_wanted
from broker.messages import Result
from broker.streams import async_stream
from broker.subjects import Subjects
from nodes.intake import consumer_name
from nodes.ingress import ASYNC_AHEAD
from support import Collector, wait_until


async def _submit_all(faas, fn: str, payload: bytes, ids: list[str]) -> None:
    for start in range(0, len(ids), 200):   # pipelined: every store awaited, 200 in flight
        await asyncio.gather(*(faas.submit("n1", fn, payload, req, timeout_s=30) for req in ids[start:start + 200]))


@pytest.mark.parametrize("calls", [100, 1000])
async def test_a_burst_of_async_calls_waits_in_the_stream_and_each_is_answered_once(node_factory, faas, nc, prefix,
                                                                                   calls):
    s = Subjects(prefix)
    ids = [f"burst{i}" for i in range(calls)]
    held_peak, backlog_seen = 0, 0
    async with Collector(nc, s.results_of("dev1")) as results, Collector(nc, s.rejects_of("dev1")) as rejects, \
            node_factory(k=4, queue=4, runtime="inprocess") as node:
        intake = node.ingress.intake
        budget = ASYNC_AHEAD * 4

        async def watch() -> None:
            nonlocal held_peak, backlog_seen
            js = nc.jetstream()
            while True:
                still_wanted()   # a cancel that consumer_info's wait_for swallowed still ends the loop
                held_peak = max(held_peak, len(intake.held))
                info = await js.consumer_info(async_stream(s), consumer_name("n1"))
                backlog_seen = max(backlog_seen, info.num_pending)
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        started = time.monotonic()
        try:
            await _submit_all(faas, "sleep", b"0.01", ids)
            await wait_until(lambda: len(results.messages) + len(rejects.messages) >= calls, timeout_s=120)
            drained_s = time.monotonic() - started
            await asyncio.sleep(1.0)   # the window in which a second answer would show up
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    print(f"{calls} async calls on K=4: drained in {drained_s:.2f} s, at most {held_peak} held, "
          f"up to {backlog_seen} waiting in the stream")
    assert not rejects.messages, [m.data[:200] for m in rejects.messages[:3]]
    answered = [decode(Result, m.data) for m in results.messages]
    assert sorted(r.request_id for r in answered) == sorted(ids)   # each once
    assert all(r.status == 200 and r.executed_by == "n1" for r in answered)
    assert held_peak <= budget            # pulled only what fits the slots and the lane
    assert backlog_seen > calls // 2      # the rest waited in the stream


async def test_direct_calls_are_still_admitted_beside_an_async_backlog(node_factory, faas, nc, prefix):
    """The async lane takes slots in turn with the direct queue; it never fills the queue that
    admission bounds, so a direct call finds a place and is answered while the backlog drains."""
    s = Subjects(prefix)
    ids = [f"bg{i}" for i in range(200)]
    async with Collector(nc, s.results_of("dev1")) as results, \
            node_factory(k=2, queue=2, runtime="inprocess") as node:
        await _submit_all(faas, "sleep", b"0.05", ids)
        await wait_until(lambda: node.scheduler.main.n_running == 2, timeout_s=10)
        answers = [await faas.invoke("n1", "echo", f"direct{i}".encode(), timeout_s=20) for i in range(5)]
        assert len(results.messages) < len(ids)   # the backlog was still draining
        await wait_until(lambda: len(results.messages) >= len(ids), timeout_s=60)
    assert [a.status for a in answers] == [200] * 5
    assert [a.output for a in answers] == [f"direct{i}".encode() for i in range(5)]


async def test_what_async_calls_hold_in_memory_is_bounded_in_bytes(node_factory, faas, nc, prefix):
    """Large inputs: the intake pulls no more bytes than it may hold (intake_hold_bytes, here 12 MiB),
    whatever the count budget allows; the rest waits in the stream, and all are answered."""
    s = Subjects(prefix)
    ids = [f"big{i}" for i in range(10)]
    peak_bytes, peak_held = 0, 0
    limit = nc.max_payload + 4 * 1024 * 1024
    async with Collector(nc, s.results_of("dev1")) as results, \
            node_factory(k=2, queue=0, runtime="inprocess", max_payload_bytes=nc.max_payload,
                         intake_hold_bytes=limit) as node:
        intake = node.ingress.intake
        assert intake.bytes_limit == limit
        body = b"0.05" + b" " * (3 * 1024 * 1024)   # sleep's input, 3 MiB

        async def watch() -> None:
            nonlocal peak_bytes, peak_held
            while True:
                peak_bytes, peak_held = max(peak_bytes, intake.held_bytes), max(peak_held, len(intake.held))
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            for req in ids:
                await faas.submit("n1", "sleep", body, req, timeout_s=30)
            await wait_until(lambda: len(results.messages) >= len(ids), timeout_s=120)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    assert sorted(decode(Result, m.data).request_id for m in results.messages) == sorted(ids)
    assert 0 < peak_bytes <= intake.bytes_limit and peak_held <= 4, (peak_bytes, peak_held)
