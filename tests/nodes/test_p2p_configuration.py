"""Every scheduling algorithm is selectable at run time (NATS subject and HTTP), persisted, and
named in ``X-P2pfaas-Scheduler`` as P2PFaaS prints it."""

from __future__ import annotations

import httpx
import orjson

from broker import headers as H
from broker.codec import decode
from broker.http_bridge import HttpBridge
from broker.messages import SchedulerConfiguration
from broker.subjects import Subjects
from nodes.scheduler.algorithms import known_algorithms

# parameters that differ from each algorithm's defaults, and how P2PFaaS prints them
EXAMPLES = {
    "NoScheduler": (["false"], "NoScheduler"),
    "ForwardScheduler": (["3"], "ForwardScheduler(3)"),
    "PowerOfNScheduler": (["2", "3", "false", "2"], "PowerOfNScheduler(2, 3, false, 2)"),
    "PowerOfNSchedulerTau": (["1", "2", "true", "1", "0.25s"], "PowerOfNSchedulerTau(1, 2, true, 1, 250ms)"),
    "RoundRobinWithMasterScheduler": (["false", "n9", "true"], "RoundRobinWithMasterScheduler(false, n9, true)"),
    "RejectScheduler": ([], "RejectScheduler"),
    "LearningScheduler": (["2", "3", "false", "true"], "LearningScheduler(2, 3, false, true)"),
}


async def test_every_algorithm_over_nats_then_persisted(node_factory, nc, prefix, tmp_path):
    s = Subjects(prefix)
    async with node_factory(data_dir=tmp_path, runtime="inprocess") as node:
        for name in known_algorithms():
            parameters, printed = EXAMPLES[name]   # every algorithm has its example: a new one must add it
            body = orjson.dumps({"name": name, "parameters": parameters})
            reply = await nc.request(s.scheduler_config("n1", "set"), body, timeout=5)
            assert reply.headers["X-P2pfaas-Status"] == "200", (name, reply.data)
            assert node.scheduler.algorithm.name == name
            assert node.scheduler.algorithm.describe() == printed
            current = decode(SchedulerConfiguration, (await nc.request(s.scheduler_config("n1", "get"), b"", timeout=5)).data)
            assert current.name == name
        before = node.scheduler.algorithm.describe()
        # refused, never read as a default: an empty body, no name, parameters that are not strings
        for bad in (b'{"name": "Nope", "parameters": []}', b'{"name": "ForwardScheduler", "parameters": ["-1"]}', b"{",
                    b"{}", b'{"parameters": ["1"]}', b'{"name": "NoScheduler", "parameters": [1]}',
                    b'{"name": "NoScheduler", "parameters": "true"}', b'{"name": "", "parameters": []}',
                    b'{"name": "NoScheduler", "parameters": ["true"], "extra": 1}'):
            reply = await nc.request(s.scheduler_config("n1", "set"), bad, timeout=5)
            assert reply.headers["X-P2pfaas-Status"] == "400" and orjson.loads(reply.data)["message"], bad
            assert node.scheduler.algorithm.describe() == before
            stored = decode(SchedulerConfiguration, (await nc.request(s.scheduler_config("n1", "get"), b"", timeout=5)).data)
            assert stored.name == node.scheduler.algorithm.name
        final = orjson.dumps({"name": "PowerOfNScheduler", "parameters": ["2", "3", "false", "2"]})
        await nc.request(s.scheduler_config("n1", "set"), final, timeout=5)
    async with node_factory(data_dir=tmp_path, runtime="inprocess") as node:  # restarted: the choice survived
        assert node.scheduler.algorithm.describe() == "PowerOfNScheduler(2, 3, false, 2)"


async def test_scheduler_over_http_and_in_the_response_header(node_factory, nc, prefix, tmp_path):
    async with node_factory(data_dir=tmp_path, runtime="inprocess"):
        bridge = await HttpBridge(nc, "n1", prefix=prefix, invoke_timeout_s=20).start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=bridge.app), base_url="http://b") as http:
                r = await http.post("/configuration/scheduler",
                                    json={"name": "PowerOfNScheduler", "parameters": ["1", "2", "true", "1"]})
                assert r.status_code == 200 and r.json()["name"] == "PowerOfNScheduler"
                assert (await http.get("/configuration/scheduler")).json()["parameters"] == ["1", "2", "true", "1"]
                r = await http.post("/function/echo", content=b"x")
                assert r.status_code == 200 and r.headers[H.SCHEDULER] == "PowerOfNScheduler(1, 2, true, 1)"
                r = await http.post("/configuration/scheduler", json={"name": "Nope", "parameters": []})
                assert r.status_code == 400 and "known" in r.json()["message"]
        finally:
            await bridge.stop()
    async with node_factory(data_dir=tmp_path, runtime="inprocess") as node:
        assert node.scheduler.algorithm.describe() == "PowerOfNScheduler(1, 2, true, 1)"
