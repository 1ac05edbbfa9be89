"""``p2pfaas up --config``: heterogeneous nodes, each with its own HTTP bridge, that find each other."""

from __future__ import annotations

import httpx
import orjson
import pytest

from p2pfaas.stack import Stack
from p2pfaas.stack_settings import StackConfig, StackSettings
from support import eventually


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
                             runtime="inprocess", http_port=28080, config=StackConfig.load(config_file),
                             controller_policy=None)
    async with Stack(settings) as stack, httpx.AsyncClient(timeout=30) as http:
        urls = stack.endpoints.http
        assert (await http.get(f"{urls['edge1']}/configuration")).json()["parallel_running_functions_max"] == 3
        assert (await http.get(f"{urls['slow2']}/configuration")).json()["parallel_running_functions_max"] == 1
        assert (await http.get(f"{urls['edge1']}/configuration/scheduler")).json() == {
            "name": "PowerOfNScheduler", "parameters": ["1", "2", "true", "1"]}
        assert (await http.get(f"{urls['slow2']}/configuration/scheduler")).json()["name"] == "NoScheduler"
        peers = await eventually(lambda: http.get(f"{urls['edge1']}/list"), lambda r: len(r.json()) == 1)
        assert [(p["name"], p["ip"], p["address"]) for p in peers.json()] == [("slow2", "127.0.0.1", urls["slow2"])]
        r = await http.post(f"{urls['slow2']}/function/sleep", content=b"0.1")
        assert r.status_code == 200
        assert float(r.headers["X-P2pfaas-Timing-Execution-Time-Seconds"]) >= 0.19   # speed 0.5: twice as long
        assert set(stack.supervisor.pids()) == {"node-edge1", "node-slow2"}   # each serves its own HTTP


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
