"""``p2pfaas up --config``: heterogeneous nodes, each with its own HTTP bridge, that find each other."""

from __future__ import annotations

import httpx
import orjson
import pytest

from p2pfaas.stack import Stack, StackConfig, StackSettings
from support import wait_until


async def test_stack_from_config_file_runs_heterogeneous_nodes(nats_server, prefix, tmp_path):
    config_file = tmp_path / "stack.json"
    config_file.write_bytes(orjson.dumps({
        "scheduler": {"name": "PowerOfNScheduler", "parameters": ["1", "2", "true", "1"]},
        "discovery": {"heartbeat_period_s": 0.2},
        "nodes": [
            {"id": "edge1", "k": 3, "queue": 0, "queue_enabled": False},
            {"id": "slow2", "k": 1, "speed": 0.5, "scheduler": {"name": "NoScheduler", "parameters": ["true"]}},
        ],
    }))
    settings = StackSettings(nats_url=nats_server.url, mqtt="off", prefix=prefix, data_dir=tmp_path / "data",
                             runtime="inprocess", http_port=28080, config=StackConfig.load(config_file))
    async with Stack(settings) as stack:
        edge, slow = stack.nodes
        assert (edge.pool.target, slow.pool.target) == (3, 1)
        assert edge.scheduler.algorithm.describe() == "PowerOfNScheduler(1, 2, true, 1)"
        assert slow.scheduler.algorithm.describe() == "NoScheduler(true)"
        urls = stack.endpoints.http
        await wait_until(lambda: list(edge.discovery.peers()) == ["slow2"], 10)
        async with httpx.AsyncClient(timeout=30) as http:
            peers = (await http.get(f"{urls['edge1']}/list")).json()
            assert [(p["name"], p["ip"]) for p in peers] == [("slow2", urls["slow2"])]
            r = await http.post(f"{urls['slow2']}/function/sleep", content=b"0.1")
            assert r.status_code == 200
            assert float(r.headers["X-P2pfaas-Timing-Execution-Time-Seconds"]) >= 0.19   # speed 0.5: twice as long


def test_config_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [{"id": "a", "k": 0}, {"id": "a"}]}')
    with pytest.raises(ValueError, match="bad.json: nodes.0.k"):
        StackConfig.load(bad)
    bad.write_text('{"nodes": [{"id": "a"}, {"id": "a"}]}')
    with pytest.raises(ValueError, match="unique"):
        StackConfig.load(bad)
    with pytest.raises(ValueError, match="cannot read"):
        StackConfig.load(tmp_path / "missing.json")


def test_config_file_sets_task_type_deadlines_on_every_node(tmp_path):
    config_file = tmp_path / "stack.json"
    config_file.write_bytes(orjson.dumps({"task_type_deadlines": {"0": 0.2, "1": 1.5}, "task_deadline_s": 3,
                                          "nodes": [{"id": "a"}, {"id": "b"}]}))
    settings = StackSettings(config=StackConfig.load(config_file), controller_policy=None)
    nodes = settings.node_settings("nats://127.0.0.1:1", ["", ""])
    assert [n.task_type_deadlines for n in nodes] == [{0: 0.2, 1: 1.5}] * 2
    assert all(n.task_deadline_s == 3 for n in nodes) and all(not n.pools for n in nodes)
