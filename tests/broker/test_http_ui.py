"""The dashboard router on a real HTTP bridge, a real node and a real nats-server: page, live
WebSocket, and the operator controls (validated here, answered by the node)."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from websockets.asyncio.client import connect as ws_connect

from broker.codec import decode, encode
from broker.http_bridge import HttpBridge
from broker.http_ui import STATIC_TYPES
from broker.messages import PolicySwitch, PolicySwitched, ScaleCommand
from broker.subjects import Subjects
from support import Collector, serving, wait_until


@pytest.fixture
async def dashboard(node_factory, nc, prefix):
    """(http client, ws url, node) for n1 with K=2, its bridge serving the dashboard."""
    async with node_factory(k=2, queue=2, telemetry_period_s=0.2) as node:
        bridge = HttpBridge(nc, "n1", prefix=prefix)
        async with serving(bridge) as http:
            yield http, str(http.base_url).replace("http://", "ws://") + "/ui/live", node


async def receive(ws, kind: str, timeout_s: float = 10.0, where=lambda data: True) -> dict:
    """The next event of ``kind`` (that ``where`` accepts) on the live socket."""
    async def wanted():
        while True:
            event = orjson.loads(await ws.recv())
            if event["type"] == kind and where(event["data"]):
                return event
    return await asyncio.wait_for(wanted(), timeout_s)


async def test_page_and_its_files_are_served(dashboard):
    http, _, _ = dashboard
    page = await http.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for name in STATIC_TYPES:
        assert f"ui/static/{name}" in page.text
        r = await http.get(f"/ui/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(STATIC_TYPES[name]) and len(r.content) > 500
    assert (await http.get("/ui/static/uPlot.LICENSE")).status_code == 404
    assert (await http.get("/ui/static/../http_ui.py")).status_code == 404
    assert "MIT" in (await http.get("/ui/static/vendor/uPlot.iife.min.js")).text.splitlines()[0]


async def test_live_socket_sends_hello_history_then_the_nodes_own_telemetry(dashboard, prefix):
    http, url, _ = dashboard
    async with ws_connect(url) as ws:
        hello = orjson.loads(await ws.recv())
        assert hello["type"] == "hello" and hello["data"]["node"] == "n1" and hello["data"]["prefix"] == prefix
        assert orjson.loads(await ws.recv())["type"] == "history"
        hb = await receive(ws, "heartbeat")
        assert hb["data"]["node"] == "n1" and hb["data"]["parallel_running_functions_max"] == 2
        sample = await receive(ws, "telemetry")
        assert sample["data"]["pool"] == "default" and sample["data"]["workers_ready"] == 2
        tick = await receive(ws, "tick", where=lambda d: d["nodes"].get("n1", {}).get("scheduler"))
        assert tick["data"]["nodes"]["n1"] == {**tick["data"]["nodes"]["n1"], "status": "alive",
                                               "scheduler": "NoScheduler"}
    # a second page gets what the first one saw as its history
    async with ws_connect(url) as ws:
        await ws.recv()
        history = orjson.loads(await ws.recv())["data"]
        assert {"heartbeat", "telemetry", "tick"} <= {e["type"] for e in history}


async def test_node_configuration_and_scheduler_through_the_dashboard(dashboard):
    http, _, node = dashboard
    r = await http.post("/ui/api/nodes/n1/configuration",
                        json={"parallel_running_functions_max": 3, "queue_length_max": 1, "queue_enabled": True})
    assert r.status_code == 200 and r.json()["parallel_running_functions_max"] == 3
    assert (await http.get("/configuration")).json()["parallel_running_functions_max"] == 3   # the bridge agrees
    await wait_until(lambda: node.pool.ready == 3, 20)

    r = await http.post("/ui/api/nodes/n1/scheduler", json={"name": "PowerOfNScheduler", "parameters": ["1", "2", "true", "1"]})
    assert r.status_code == 200 and r.json()["name"] == "PowerOfNScheduler"
    assert (await http.get("/ui/api/nodes/n1/scheduler")).json()["parameters"] == ["1", "2", "true", "1"]

    bad = [
        ("/ui/api/nodes/n1/configuration", {"parallel_running_functions_max": 0}, 400, "parallel_running_functions_max"),
        ("/ui/api/nodes/n1/configuration", {"nonsense": 1}, 400, "nonsense"),
        ("/ui/api/nodes/n1/scheduler", {"name": "NoSuchScheduler", "parameters": []}, 400, "NoSuchScheduler"),
        ("/ui/api/nodes/n1/scheduler", {"name": "PowerOfNScheduler", "parameters": ["x"]}, 400, ""),
        ("/ui/api/nodes/bad.node/configuration", {"parallel_running_functions_max": 2}, 400, "invalid node"),
        ("/ui/api/nodes/n9/configuration", {"parallel_running_functions_max": 2}, 503, "nobody answered"),
    ]
    for path, body, status, reason in bad:
        r = await http.post(path, json=body)
        assert r.status_code == status and reason in r.json()["message"], (path, r.text)
    assert (await http.post("/ui/api/nodes/n1/configuration", content=b"{not json")).status_code == 400
    assert (await http.get("/configuration")).json()["parallel_running_functions_max"] == 3   # nothing changed
    # an empty scheduler change is refused (it was read as NoScheduler) and nothing changes
    r = await http.post("/ui/api/nodes/n1/scheduler", json={})
    assert r.status_code == 400 and "name" in r.json()["message"], r.text
    assert (await http.get("/ui/api/nodes/n1/scheduler")).json()["name"] == "PowerOfNScheduler"
    # a change of one key keeps the others, as POST /configuration (defaults filled in here reset K to 4)
    r = await http.post("/ui/api/nodes/n1/configuration", json={"queue_length_max": 2})
    assert r.status_code == 200, r.text
    assert r.json()["parallel_running_functions_max"] == 3 and r.json()["queue_length_max"] == 2


async def test_scaling_by_hand_publishes_a_manual_scale_command(dashboard, nc, prefix):
    http, url, node = dashboard
    s = Subjects(prefix)
    r = await http.post("/ui/api/pools/n1/default/scale", json={"target_workers": 3})
    assert r.status_code == 404 and "open /ui first" in r.json()["message"]   # no telemetry seen yet
    async with ws_connect(url) as ws:
        await receive(ws, "telemetry")
        async with Collector(nc, s.scale("n1", "default")) as commands:
            r = await http.post("/ui/api/pools/n1/default/scale", json={"target_workers": 3})
            assert r.status_code == 202
            await asyncio.wait_for(commands.event.wait(), 5)
        command = decode(ScaleCommand, commands.messages[0].data)
        assert (command.target_workers, command.policy, command.node, command.pool) == (3, "manual", "n1", "default")
        decision = await receive(ws, "scale")
        assert decision["data"]["policy"] == "manual" and decision["data"]["target_workers"] == 3
    await wait_until(lambda: node.pool.ready == 3, 20)   # the main pool's size is K
    for body in ({"target_workers": -1}, {"target_workers": "many"}, {}):
        assert (await http.post("/ui/api/pools/n1/default/scale", json=body)).status_code == 400
    assert (await http.post("/ui/api/pools/n1/no-such-pool/scale", json={"target_workers": 1})).status_code == 404


async def test_policy_switch_is_a_typed_request_to_the_controller(dashboard, nc, prefix):
    http, _, _ = dashboard
    s = Subjects(prefix)
    r = await http.post("/ui/api/pools/n1/farm/policy", json={"policy": "kpa"})
    assert r.status_code == 503 and f"{prefix}.n1.policy.farm" in r.json()["message"]

    asked: list[PolicySwitch] = []

    async def controller(msg):   # what the live controller must answer (docs/dashboard.md)
        asked.append(decode(PolicySwitch, msg.data))
        await msg.respond(encode(PolicySwitched(node="n1", pool="farm", policy="kpa", previous="dqn")))
    sub = await nc.subscribe(s.pool_policy("n1", "farm"), cb=controller)
    try:
        r = await http.post("/ui/api/pools/n1/farm/policy", json={"policy": "kpa"})
        assert r.status_code == 200 and r.json() == {"node": "n1", "pool": "farm", "policy": "kpa",
                                                     "previous": "dqn", "note": ""}
        assert asked[0].policy == "kpa" and asked[0].requested_by == "ui@n1"
        for body in ({"policy": "no such policy!"}, {"policy": ""}, {"name": "kpa"}):
            assert (await http.post("/ui/api/pools/n1/farm/policy", json=body)).status_code == 400
        assert len(asked) == 1   # refused here, never sent
    finally:
        await sub.unsubscribe()


async def test_shutdown_closes_open_pages_at_once(node_factory, nc, prefix):
    async with node_factory():
        bridge = HttpBridge(nc, "n1", prefix=prefix)
        async with serving(bridge) as http:
            url = str(http.base_url).replace("http://", "ws://") + "/ui/live"
            ws = await ws_connect(url)
            await ws.recv()
            started = time.monotonic()
        # serving() shut the server down: the page was told (1012, service restart) without waiting
        # for uvicorn's graceful timeout, and the feed let go of its subscriptions
        assert time.monotonic() - started < 3
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.close_code == 1012
