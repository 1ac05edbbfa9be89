"""``p2pfaas farm run``'s emitter on a real nats-server: how long it waits for stragglers and how
it counts the tasks that got no answer."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import time

from broker.streams import ensure_node_streams
from broker.subjects import Subjects
from controller.emitter import POOL_FIGURES, FarmEmitter
from nodes.settings import PoolSpec
from support import eventually

from .conftest import make_scenario

# 12 s of arrivals at 4x speed (3 s of wall time), ~12 tasks
QUIET = make_scenario(step_seconds=1.0, max_steps=11, service_time={"dist": "constant", "value": 0.2},
                      phases=[{"duration_s": 12.0, "rate_per_s": 1.0}])
SPEED = 4.0


async def test_tasks_nobody_runs_are_waited_for_grace_seconds_after_the_last_arrival_and_counted_unfinished(
        nc, prefix):
    """No node consumes the intake: every task stays queued. The emitter waited `horizon + grace`
    after *each* task's send (for bursty, ~5 minutes after the last arrival instead of 60 s, with
    the pool's worker-seconds measured all along), then called every queued task lost."""
    await ensure_node_streams(nc.jetstream(), Subjects(prefix), "n1")
    emitter = FarmEmitter(nc, "n1", QUIET, seed=1, prefix=prefix, speed=SPEED, grace_s=0.5)
    started = time.monotonic()
    report = await emitter.run()
    elapsed = time.monotonic() - started
    horizon = QUIET.episode_seconds / SPEED
    assert report.submitted >= 3
    assert elapsed < horizon + 0.5 + 1.0, elapsed          # the arrivals, the grace, a margin
    assert (report.completed, report.lost, report.unfinished) == (0, 0, report.submitted)


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT as a terminal delivers it. A test run started in the background by a
    non-interactive shell (``cmd &``) has SIGINT ignored, and its children inherit that: the
    Ctrl-C below would be ignored and the run go on to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_ctrl_c_mid_run_prints_what_was_measured_so_far(nats_server, nc, prefix, tmp_path):
    """Ctrl-C in the middle of ``p2pfaas farm run``: a summary of the tasks sent so far, marked
    interrupted, exit status 130 (it ended with the progress bar and no figures at all)."""
    from broker.streams import async_stream
    from stack_processes import P2PFAAS

    subjects = Subjects(prefix)
    await ensure_node_streams(nc.jetstream(), subjects, "n1")
    scenario = tmp_path / "slow.json"
    scenario.write_text(make_scenario(step_seconds=5.0, max_steps=11,
                                      phases=[{"duration_s": 60.0, "rate_per_s": 2.0}]).model_dump_json())
    proc = await asyncio.create_subprocess_exec(
        *P2PFAAS, "farm", "run", "--scenario", str(scenario), "--nats-url", nats_server.url, "--prefix", prefix,
        "--data-dir", str(tmp_path), "--pool", "farm", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env={**os.environ, "PYTHONFAULTHANDLER": "1"}, preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        async def stored() -> int:
            return (await nc.jetstream().stream_info(async_stream(subjects))).state.messages
        await eventually(stored, lambda n: n >= 3, timeout_s=60, interval_s=0.2)   # the run is under way
        proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(30):
                out = (await proc.communicate())[0].decode()
        except TimeoutError:   # where it hangs (PYTHONFAULTHANDLER: the stacks on SIGABRT)
            proc.send_signal(signal.SIGABRT)
            async with asyncio.timeout(10):
                out = (await proc.communicate())[0].decode(errors="replace")
            raise AssertionError(f"farm run did not end within 30 s of its Ctrl-C:\n{out[-6000:]}") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, out
    assert "interrupted" in out and "tasks " in out and "Traceback" not in out, out
    # into a pipe: plain progress lines as it goes (a bar there was drawn only at the end)
    assert re.search(r"^\d\d:\d\d:\d\d \S+ -> n1: \d+ sent, \d+ done: \d+ %, \d+ s$", out, re.M), out


async def test_a_stack_that_stops_mid_run_ends_the_run_soon_and_says_why(tmp_path, caplog):
    """The stack stopped 1.5 s into a 10 s run: the emitter went on for the rest of the horizon
    (bursty: 4 minutes), every later task refused after 6 s of retries with a warning line each
    (81 lines here). Now the run stops once the broker has been away broker_patience_s, says why,
    and logs a few refusals, not one per task."""
    from broker.connection import close_quietly, connect
    from broker.embedded import NatsServer

    server = NatsServer(data_dir=tmp_path / "nats", port=None, mqtt_port=0)
    await server.start()
    conn = await connect(server.url, "farm-emitter")
    try:
        await ensure_node_streams(conn.jetstream(), Subjects("faas"), "n1")
        scenario = make_scenario(step_seconds=1.0, max_steps=9, service_time={"dist": "constant", "value": 0.2},
                                 phases=[{"duration_s": 10.0, "rate_per_s": 5.0}])
        emitter = FarmEmitter(conn, "n1", scenario, seed=1, grace_s=2.0)
        emitter.broker_patience_s = 1.0
        run = asyncio.create_task(emitter.run())
        await asyncio.sleep(1.5)
        await server.stop()
        stopped = time.monotonic()
        async with asyncio.timeout(30):
            report = await run
        after_s = time.monotonic() - stopped
    finally:
        await close_quietly(conn)
    assert after_s < 4.0, after_s                                   # patience 1 s, a margin
    assert report.interrupted and "unreachable" in report.stopped_because
    assert report.submitted >= 3 and report.completed == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "controller.emitter"]
    assert len(warnings) <= 5, [r.getMessage() for r in warnings]


async def test_farm_run_into_a_file_shows_progress_and_one_set_of_figures(node_factory, nats_server, prefix, tmp_path):
    """Into a pipe, `farm run` printed nothing until the end; its JSON gave the tasks' p95 and
    unfinished from the answers and, under "pool", other ones from the telemetry."""
    from stack_processes import P2PFAAS

    scenario = tmp_path / "short.json"
    scenario.write_text(make_scenario(step_seconds=1.0, max_steps=5, workers={"min": 1, "max": 4, "initial": 2},
                                      service_time={"dist": "constant", "value": 0.1},
                                      phases=[{"duration_s": 6.0, "rate_per_s": 3.0}]).model_dump_json())
    pools = {"farm": PoolSpec(functions=["sleep"], initial=2, min=1, max=4, period_s=1.0)}
    async with node_factory(k=2, pools=pools, runtime="process"):
        proc = await asyncio.create_subprocess_exec(
            *P2PFAAS, "farm", "run", "--scenario", str(scenario), "--nats-url", nats_server.url, "--prefix", prefix,
            "--data-dir", str(tmp_path), "--pool", "farm", "--json", str(tmp_path / "run.json"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            async with asyncio.timeout(90):
                out = (await proc.communicate())[0].decode()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert re.search(r"^\d\d:\d\d:\d\d test -> n1: \d+ sent, \d+ done: 100 %, \d+ s$", out, re.M), out
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["tasks"] == report["completed"] > 0 and report["unfinished"] == 0 and report["qos"] > 0
    assert set(report["pool"]) == POOL_FIGURES and report["pool"]["worker_seconds"] > 0, report
    assert f"p95 latency {report['p95_s']:.2f} s" in out and f"{report['pool']['worker_seconds']:.0f} worker-s" in out
