"""Stopping what runs: a cancellation is never lost on the way (Python 3.11's asyncio.wait_for
returns normally when the cancellation comes as its awaitable completes; nats-py's requests,
flushes and JetStream calls use it)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from broker.lifecycle import still_wanted

ROOT = Path(__file__).resolve().parents[2]


async def test_a_loop_that_checks_it_is_still_wanted_stops_though_a_library_swallowed_its_cancellation():
    done = asyncio.Event()

    async def library_call() -> None:   # what nats-py's request does: wait_for on a reply future
        try:
            await asyncio.wait_for(done.wait(), 5)
        except asyncio.TimeoutError:
            pass

    async def loop(guarded: bool) -> None:
        while True:
            if guarded:
                still_wanted()
            await library_call()
            done.clear()
            await asyncio.sleep(0.001)

    for guarded in (False, True):
        task = asyncio.create_task(loop(guarded))
        await asyncio.sleep(0.01)
        done.set()                   # the reply comes ...
        await asyncio.sleep(0)       # ... wait_for's inner wait has it ...
        task.cancel()                # ... and the stop comes before the loop resumed
        finished, _ = await asyncio.wait({task}, timeout=0.5)
        if guarded:
            assert finished and task.cancelled()
        else:   # the swallowed cancellation: the unguarded loop runs on
            assert not finished, "Python no longer swallows it: still_wanted may be retired"
            task.cancel()
            await asyncio.wait({task}, timeout=1)


def test_the_product_code_does_not_use_asyncio_wait_for():
    """asyncio.timeout (3.11) raises a cancellation that comes as the awaited thing completes;
    wait_for swallowed one in the node's intake and its stop waited for ever."""
    found = subprocess.run(["git", "grep", "-n", "asyncio.wait_for(", "--", "*.py", ":!tests", ":!bench"],
                           cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert found.returncode == 1 and not found.stdout, found.stdout   # 1: no match
