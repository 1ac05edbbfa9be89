"""``p2pfaas top`` as a user runs it: into a file or a pipe it prints plain snapshots as it goes
(a live screen there was drawn only at the end, so ``timeout 10 p2pfaas top > file`` wrote
nothing), and its durations must be more than 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

from broker.codec import encode
from broker.messages import Heartbeat
from broker.subjects import Subjects

from stack_processes import P2PFAAS

RUN_S = 4.0   # top's life before it is ended as `timeout` does, with SIGTERM


async def test_top_into_a_pipe_prints_a_plain_snapshot_each_interval(nats_server, nc, prefix, tmp_path):
    top = await asyncio.create_subprocess_exec(
        *P2PFAAS, "top", "--nats-url", nats_server.url, "--prefix", prefix, "--interval", "1",
        "--data-dir", str(tmp_path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "400"})
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RUN_S
        while loop.time() < deadline and top.returncode is None:   # a node seen by top
            await nc.publish(Subjects(prefix).membership("n7"), encode(Heartbeat(node="n7", running=3)))
            await asyncio.sleep(0.2)
        top.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(top.communicate(), 30)
    finally:
        if top.returncode is None:
            top.kill()
            await top.wait()
    text = out.decode()
    assert "Traceback" not in err.decode(), err.decode()
    snapshots = text.count("\n-- ") + text.startswith("-- ")
    assert snapshots >= 2, text   # one a second, whatever ended it
    assert text.count("nodes") >= 2 and "pools" in text and "n7" in text
    assert "\x1b" not in text   # plain text: no cursor moves, no colours


def test_top_durations_must_be_positive(tmp_path):
    for args in (["--once", "-1"], ["--once", "0"], ["--interval", "0"]):
        done = subprocess.run([*P2PFAAS, "top", *args, "--data-dir", str(tmp_path)], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "COLUMNS": "400"})
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"Invalid value for '{args[0]}': {args[1]} is not more than 0 seconds" in done.stderr, done.stderr
