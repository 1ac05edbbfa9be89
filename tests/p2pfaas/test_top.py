"""``p2pfaas top`` as a user runs it: into a file or a pipe it prints plain snapshots as it goes
(a live screen there was drawn only at the end, so ``timeout 10 p2pfaas top > file`` wrote
nothing), and its durations must be more than 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

from broker.codec import encode
from broker.messages import Heartbeat, PoolPulse, PoolTelemetry, ScaleCommand
from broker.subjects import Subjects

from stack_processes import P2PFAAS

RUN_S = 4.0   # top's life before it is ended as `timeout` does, with SIGTERM


async def run_top(nats_server, prefix, tmp_path, *args: str, columns: int, publish, run_s: float | None = None):
    """`p2pfaas top ARGS` into a pipe while ``publish()`` runs every 0.2 s; ended with SIGTERM (as
    `timeout` does) after ``run_s``, else left to end by itself. (returncode, stdout, stderr)."""
    top = await asyncio.create_subprocess_exec(
        *P2PFAAS, "top", "--nats-url", nats_server.url, "--prefix", prefix, *args, "--data-dir", str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": str(columns)})
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (run_s or 30)
        while loop.time() < deadline and top.returncode is None:
            await publish()
            await asyncio.sleep(0.2)   # a publisher's pace, not a wait for a condition
        if run_s is not None:
            top.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(top.communicate(), 30)
    finally:
        if top.returncode is None:
            top.kill()
            await top.wait()
    return top.returncode, out.decode(), err.decode()


async def test_top_into_a_pipe_prints_a_plain_snapshot_each_interval(nats_server, nc, prefix, tmp_path):
    async def a_node():
        await nc.publish(Subjects(prefix).membership("n7"), encode(Heartbeat(node="n7", running=3)))

    _, text, err = await run_top(nats_server, prefix, tmp_path, "--interval", "1", columns=400, publish=a_node,
                                 run_s=RUN_S)
    assert "Traceback" not in err, err
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


async def test_top_once_shows_every_pool_whole_at_80_columns(nats_server, nc, prefix, tmp_path):
    """A pool whose control period (8 s) is longer than --once is shown from its pulses (it was
    left out), and every table fits 80 columns (the pool headers were "no… po… wo…")."""
    subjects = Subjects(prefix)

    async def a_stack():
        now = time.time()
        await nc.publish(subjects.membership("n7"), encode(Heartbeat(
            node="n7", address="http://127.0.0.1:18080", running=3, queued=12,
            parallel_running_functions_max=128, queue_length_max=100_000)))
        await nc.publish(subjects.telemetry("n7", "main"), encode(PoolTelemetry(
            node="n7", pool="main", time=now, period_s=1, queue_length=1234, in_service=128, workers_ready=128,
            workers_starting=0, arrivals=1000, completed=999, met_deadline=990, arrival_rate=1000.0,
            throughput=999.0, latency_mean_s=0.1, latency_p95_s=12.3, latency_max_s=13.0, qos=0.99)))
        await nc.publish(subjects.pulse("n7", "farm"), encode(PoolPulse(
            node="n7", pool="farm", time=now, window_s=2, arrivals=31, queue_length=7, workers_ready=1,
            workers_starting=3)))
        await nc.publish(subjects.scale("n7", "farm"), encode(ScaleCommand(
            node="n7", pool="farm", target_workers=12, policy="pg", model_version="shipped-17")))

    code, text, err = await run_top(nats_server, prefix, tmp_path, "--once", "3", columns=80, publish=a_stack)
    assert code == 0 and "Traceback" not in err, err
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in text, text
    rows = {tuple(line.split()[:2]) for line in lines}
    assert ("n7", "farm") in rows and ("n7", "main") in rows, text
    for header in ("running", "queue max", "ready", "starting", "busy", "in/s", "done/s", "p95", "QoS", "target",
                   "policy", "model"):
        assert header in text, (header, text)
    farm = next(line for line in lines if line.split()[:2] == ["n7", "farm"] and "15.50" in line)
    assert farm.split()[2:5] == ["1", "3", "7"], farm   # ready, starting, queue from the pulse
    assert "shipped-17" in text and "12345" not in text and "12300 ms" in text
