"""A node's in-process door: the HTTP bridge that runs in the node's process (``p2pfaas node
--http-port``, what ``up`` runs) hands direct calls to the node without a hop through nats-server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from broker import headers as H
from broker.http_bridge import HttpBridge
from support import Collector, wait_until

pytestmark = pytest.mark.nats


async def bridge_with_door(nc, node, prefix: str) -> HttpBridge:
    bridge = await HttpBridge(nc, node.settings.node_id, prefix=prefix, invoke_timeout_s=20).start()
    bridge.faas.open_door(node.settings.node_id, node.ingress.door)
    return bridge


def client(bridge: HttpBridge) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=bridge.app), base_url="http://bridge", timeout=30)


async def test_a_direct_call_through_the_door_skips_the_broker_and_is_answered_as_over_nats(node_factory, nc, prefix):
    async with node_factory(k=2) as node, Collector(nc, f"{prefix}.n1.request.>") as seen:
        bridge = await bridge_with_door(nc, node, prefix)
        plain = await HttpBridge(nc, "n1", prefix=prefix, invoke_timeout_s=20).start()   # the same, without the door
        try:
            async with client(bridge) as http, client(plain) as far:
                r = await http.post("/function/fib", content=b"20", headers={H.TRACING_ID: "door-1"})
                assert r.status_code == 200 and r.text == "6765", r.text
                # the node decided it, a worker ran it and answered the bridge's inbox over NATS
                assert r.headers[H.SCHEDULER].startswith("NoScheduler")
                assert float(r.headers[H.TIMING_EXECUTION]) > 0
                assert len(r.headers[H.TIMING_TOTAL]) > 2
                bad = await http.post("/function/nope", content=b"1")
                assert bad.status_code == 404 and "unknown function" in bad.json()["message"]
                assert seen.messages == []   # nothing went over nats-server to the node's door

                r = await far.post("/function/fib", content=b"20")
                assert r.status_code == 200 and r.text == "6765"
                await wait_until(lambda: len(seen.messages) == 1)   # the other path does
        finally:
            await bridge.stop()
            await plain.stop()


async def test_a_stopping_node_closes_its_door_and_callers_are_told(node_factory, nc, prefix):
    async with node_factory(k=1) as node:
        bridge = await bridge_with_door(nc, node, prefix)
        try:
            async with client(bridge) as http:
                assert (await http.post("/function/echo", content=b"hi")).text == "hi"
                await node.ingress.stop()   # what a node's stop does first
                r = await http.post("/function/echo", content=b"hi")
                # the door is closed; over NATS nobody listens any more: 503 at once, not a hang
                assert r.status_code == 503 and "not running" in r.json()["message"], r.text
        finally:
            await bridge.stop()


async def test_a_call_the_door_fails_on_is_answered_500_at_once(node_factory, nc, prefix, monkeypatch):
    async with node_factory(k=1) as node:
        bridge = await bridge_with_door(nc, node, prefix)

        def broken(*args) -> None:
            raise RuntimeError("a bug in the node")

        monkeypatch.setattr(node.ingress, "_on_request", broken)
        try:
            async with client(bridge) as http:
                r = await asyncio.wait_for(http.post("/function/echo", content=b"hi"), 10)
                assert r.status_code == 500 and "the node failed on this call" in r.json()["message"], r.text
        finally:
            await bridge.stop()
