"""Three nats-servers forming a NATS cluster on loopback, one node attached to each:
discovery, probes and forwarding work across servers."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import free_port, nats_cluster
from broker.messages import NodeConfiguration, SchedulerConfiguration
from nodes.node import Node
from nodes.settings import NodeSettings
from support import wait_until


@pytest.fixture
async def three_servers(tmp_path):
    servers = nats_cluster(3, tmp_path / "cluster")
    try:
        await asyncio.gather(*(s.start() for s in servers))
        yield servers
    finally:
        await asyncio.gather(*(s.stop() for s in servers))


async def test_discovery_and_forwarding_across_a_nats_cluster(three_servers, tmp_path, prefix):
    scheduler = SchedulerConfiguration(name="ForwardScheduler", parameters=["2"])
    async with contextlib.AsyncExitStack() as stack:
        nodes: list[Node] = []
        for i, server in enumerate(three_servers):
            # n3's first URL is dead: it reaches its server through the seed list
            url, seeds = (server.url, []) if i < 2 else (f"nats://127.0.0.1:{free_port()}", [server.url])
            settings = NodeSettings(node_id=f"n{i + 1}", nats_url=url, seeds=seeds, prefix=prefix,
                                    data_dir=tmp_path, runtime="inprocess", heartbeat_period_s=0.2, learner=False,
                                    initial=NodeConfiguration(parallel_running_functions_max=2),
                                    initial_scheduler=scheduler)
            nodes.append(await stack.enter_async_context(Node(settings)))
        assert [n.nc.connected_url.port for n in nodes] == [s.port for s in three_servers]
        ids = {"n1", "n2", "n3"}
        await wait_until(lambda: all(set(n.discovery.peers()) == ids - {n.settings.node_id} for n in nodes), 20)
        assert await nodes[0].discovery.probe("n3") == 0     # request/reply crosses servers too

        nc = await connect(three_servers[0].url, "cluster-client")   # the caller sits on server 1
        stack.push_async_callback(close_quietly, nc)
        faas = await stack.enter_async_context(FaasClient(nc, client="dev1", prefix=prefix))
        answers = await asyncio.gather(*(faas.invoke("n1", "echo", b"x", timeout_s=30) for _ in range(3)),
                                       faas.invoke("n3", "echo", b"y", timeout_s=30))
    for res in answers[:3]:
        # n1 (server 1) -> a peer on another server -> the third node, on the third server
        assert res.status == 200 and res.hops == 2 and res.peers[0] == "n1" and set(res.peers) == ids
    assert answers[3].peers[0] == "n3" and answers[3].output == b"y"
