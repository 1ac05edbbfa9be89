"""The dashboard as an operator sees it: ``p2pfaas up`` as a subprocess, ``/ui`` in a real headless
Chromium, load on the stack; the page must show the numbers the nodes publish, the controller's
scaling decisions, and change a node's K through its form. Leaves a screenshot in the tmp dir."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from broker.auth import OPERATOR, AuthStore
from broker.codec import decode
from broker.connection import close_quietly, connect
from broker.embedded import free_port
from broker.messages import Heartbeat, PoolTelemetry, ScaleCommand
from broker.subjects import Subjects
from browser import Chromium, chromium_path
from support import wait_until

pytestmark = pytest.mark.browser

POOL_FIELDS = ("workers_ready", "workers_starting", "workers_stopping", "queue_length", "in_service",
               "arrival_rate", "latency_p95_s", "qos")
READ_POOL = """(() => {
  const card = document.querySelector('[data-pool="n1/farm"]');
  if (!card || !card.dataset.time) return null;
  const value = name => card.querySelector(`[data-field="${name}"]`);
  return {time: Number(card.dataset.time),
          values: Object.fromEntries(%s.map(n => [n, Number(value(n).dataset.value)])),
          texts: Object.fromEntries(%s.map(n => [n, value(n).textContent]))};
})()""" % (json.dumps(POOL_FIELDS), json.dumps(POOL_FIELDS))
READ_NODE = """(() => {
  const card = document.querySelector('[data-node="%s"]');
  if (!card || !card.dataset.time) return null;
  const value = name => Number(card.querySelector(`[data-field="${name}"]`).dataset.value);
  return {time: Number(card.dataset.time), running: value("running"), queued: value("queued"), k: value("k"),
          status: card.querySelector('[data-field="status"]').textContent};
})()"""
READ_DECISIONS = """[...document.querySelectorAll('[data-pool="n1/farm"] ol.decisions li')]
  .map(li => ({at: Number(li.dataset.at), target: Number(li.dataset.target), policy: li.dataset.policy}))"""


@contextlib.asynccontextmanager
async def p2pfaas_up(data_dir: Path, *flags: str):
    """``p2pfaas up`` as a user runs it; yields its endpoints.json; SIGINT and a clean exit at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "p2pfaas.cli", "up", "--data-dir", str(data_dir), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        endpoints_file = data_dir / "endpoints.json"
        await wait_until(lambda: endpoints_file.exists() or proc.poll() is not None, 60, 0.1)
        assert proc.poll() is None, f"p2pfaas up exited with {proc.returncode}:\n{proc.stdout.read()}"
        yield json.loads(endpoints_file.read_text())
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, out


async def keep_busy(http: dict[str, str]) -> None:
    """Farm tasks on n1 (the autoscaled pool runs `sleep`) and fib on n2, a few in flight, until cancelled."""
    async with httpx.AsyncClient(timeout=30) as client:
        async def loop(url: str, body: bytes) -> None:
            while True:
                await client.post(url, content=body)
        await asyncio.gather(*(loop(f"{http['n1']}/function/sleep", b"0.4") for _ in range(6)),
                             *(loop(f"{http['n2']}/function/fib", b"24") for _ in range(2)))


async def test_dashboard_shows_live_telemetry_decisions_and_changes_k(tmp_path):
    if chromium_path() is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (.ci/run does this)")
    flags = ("--nodes", "2", "--k", "2", "--http-port", str(free_port()), "--nats-port", str(free_port()),
             "--mqtt", "off", "--scenario", "spike", "--controller", "reactive-max")
    async with p2pfaas_up(tmp_path / "data", *flags) as endpoints:
        store = AuthStore(tmp_path / "data" / "auth")   # the stack is secure: the test is its operator
        operator = store.service(OPERATOR)
        nc = await connect(endpoints["nats_url"], "dashboard-test", credentials=(operator.user, operator.password))
        subjects = Subjects(endpoints["prefix"])
        samples: dict[float, PoolTelemetry] = {}
        heartbeats: dict[tuple[str, float], Heartbeat] = {}
        commands: list[ScaleCommand] = []

        async def on_telemetry(msg):
            sample = decode(PoolTelemetry, msg.data)
            samples[sample.time] = sample

        async def on_heartbeat(msg):
            hb = decode(Heartbeat, msg.data)
            heartbeats[(hb.node, hb.time)] = hb

        async def on_scale(msg):
            commands.append(decode(ScaleCommand, msg.data))

        subs = [await nc.subscribe(subjects.telemetry("n1", "farm"), cb=on_telemetry),
                await nc.subscribe(subjects.all_membership(), cb=on_heartbeat),
                await nc.subscribe(subjects.scale("n1", "farm"), cb=on_scale)]
        load = None
        try:
            async with Chromium(tmp_path / "chromium") as page:
                await page.open(f"{endpoints['http']['n1']}/ui")
                # the operator gave the page their token once (it asks on the first refused change)
                await page.evaluate(f"localStorage.setItem('p2pfaasOperatorToken', '{store.operator_token()}')")
                await page.wait_for("document.querySelector('#connection').dataset.state === 'live'", 15)
                load = asyncio.create_task(keep_busy(endpoints["http"]))

                # the farm pool card shows a sample with arrivals, number for number as the node published it
                shown = await page.wait_for(f"(s => s && s.values.arrival_rate > 0 && s)({READ_POOL})", 30)
                await wait_until(lambda: shown["time"] in samples, 5)
                sample = samples[shown["time"]]
                for name in POOL_FIELDS:
                    assert shown["values"][name] == pytest.approx(getattr(sample, name)), name
                assert shown["texts"]["workers_ready"] == str(sample.workers_ready)
                assert shown["texts"]["arrival_rate"] == f"{sample.arrival_rate:.2f}"
                if sample.completed:
                    assert shown["texts"]["qos"] == f"{100 * sample.qos:.1f} %"

                # ... and each node card a heartbeat of that node
                for node in ("n1", "n2"):
                    card = await page.wait_for(READ_NODE % node, 10)
                    await wait_until(lambda: (node, card["time"]) in heartbeats, 5)
                    hb = heartbeats[(node, card["time"])]
                    assert (card["running"], card["queued"], card["k"], card["status"]) == \
                        (hb.running, hb.queued, hb.parallel_running_functions_max, "alive")

                # a decision of the controller appears, with its policy and target
                decisions = await page.wait_for(f"(d => d.some(x => x.policy === 'reactive-max') && d)({READ_DECISIONS})", 20)
                def published() -> set:
                    return {(round(c.at, 3), c.target_workers, c.policy) for c in commands}
                await wait_until(lambda: {(round(d["at"], 3), d["target"], d["policy"]) for d in decisions} <= published(), 5)

                # K of n2 through its form: the node applies it and the page shows it from the next heartbeat
                await page.evaluate("document.querySelector('[data-node=\"n2\"] details').open = true")
                form = "document.querySelector('[data-node=\"n2\"] form[data-form=\"configuration\"]')"
                await page.wait_for(f"{form}.elements.parallel_running_functions_max.value === '2'", 10)
                await page.evaluate(f"{form}.elements.parallel_running_functions_max.value = '3'; {form}.requestSubmit()")
                await page.wait_for(f"(n => n && n.k === 3)({READ_NODE % 'n2'})", 15)
                async with httpx.AsyncClient() as client:
                    configuration = (await client.get(f"{endpoints['http']['n2']}/configuration")).json()
                assert configuration["parallel_running_functions_max"] == 3

                await page.wait_for("document.body.dataset.rendered", 5)
                shot = await page.screenshot(tmp_path / "dashboard.png")
                assert shot.stat().st_size > 20_000
                assert page.errors == []
        finally:
            if load is not None:
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
            await close_quietly(nc, *subs)
