"""P2PFaaS's own clients against ``p2pfaas up --nodes 3 --loopback-hosts`` (docs/compat.md).

Route by route, the requests the original clients send -- the Go benchmark client's start-up
checks, its invocations with the payload mix and its learning batches, the Python experiment
scripts' calls, a P2PFaaS node's discovery polls and forwards -- and what those clients parse.
The last test builds the original benchmark client from its stored source, unmodified, and
runs its documented command line (checks on, ``-learning``) against the stack.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from broker import codes
from broker.auth import AuthStore
from broker import headers as H
from broker.embedded import free_port
from p2pfaas_client import build_benchmark_client, documented_command_line
from support import eventually, wait_until

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "_support"
PAYLOADS = {0: b"\xff\xd8" + bytes(28_000), 1: b"\xff\xd8" + bytes(15_000)}   # the 320p and 100p blobs' sizes


class Stack(list):
    """The hosts, and the operator's header (P2PFaaS's own clients send none: they do not need it)."""

    def __init__(self, hosts: list[str], token: str) -> None:
        super().__init__(hosts)
        self.operator = {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    """Three nodes on 127.N.M.1..3 (a random 127/8 network: no clash with another run) with
    P2PFaaS's ports, set up as a P2PFaaS operator would: fn-pigo deployed through OpenFaaS's
    route, K=3 without a queue, the LearningScheduler for two task types."""
    data = tmp_path_factory.mktemp("compat")
    net = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
    env = {**os.environ, "PYTHONPATH": f"{SUPPORT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2pfaas.cli", "up", "--nodes", "3", "--loopback-hosts", "--loopback-net", net,
         "--data-dir", str(data), "--controller", "off", "--mqtt", "off", "--nats-port", str(free_port()),
         "--no-node-rewards"], env=env, cwd=ROOT, stdin=subprocess.PIPE,
        stdout=open(data / "up.log", "wb"), stderr=subprocess.STDOUT)
    hosts = [f"{net}.{i}" for i in (1, 2, 3)]
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            await wait_until(lambda: (data / "endpoints.json").exists() or proc.poll() is not None, 90, 0.2)
            assert proc.poll() is None, (data / "up.log").read_text()
            hosts = Stack(hosts, AuthStore(data / "auth").operator_token())
            for host in hosts:   # the operator's set-up: with the operator token, as the docs show
                r = await http.post(f"http://{host}:18080/system/functions", headers=hosts.operator,
                                    json={"service": "fn-pigo", "reference": "standin_functions:fn_pigo",
                                          "envVars": {"ignored": "yes"}, "network": "func_functions"})
                assert r.status_code == 200, r.text
                assert (await http.post(f"http://{host}:18080/configuration", headers=hosts.operator, json={
                    "parallel_running_functions_max": 3, "queue_length_max": 2, "queue_enabled": False})).is_success
                assert (await http.post(f"http://{host}:18080/configuration/scheduler", headers=hosts.operator,
                                        json={"name": "LearningScheduler", "parameters": ["2"]})).is_success
            # and without it, a change is refused: the compat layout is as secure as the default one
            r = await http.post(f"http://{hosts[0]}:18080/configuration/scheduler",
                                json={"name": "RoundRobinScheduler", "parameters": []})
            assert r.status_code == 401, r.text
            await eventually(lambda: http.get(f"http://{hosts[0]}:19000/list"), lambda r: r.text.count("alive") == 2, 30)
        yield hosts
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def same_on_every_host(http, hosts, port: int, path: str) -> str:
    bodies = {(await http.get(f"http://{host}:{port}/{path}")).text for host in hosts}
    assert len(bodies) == 1, (path, bodies)
    return bodies.pop()


# -- the benchmark client (experiments/benchmark-go) ----------------------------------------------
async def test_benchmark_client_start_up_checks(stack, http):
    """check.All: identical hellos and configurations, the function answering 200 with the bypass
    header (a GET, no body), every discovery list naming the other hosts, the learner reset."""
    hello = orjson.loads(await same_on_every_host(http, stack, 18080, ""))
    assert set(hello) == {"name", "version", "version_commit"}
    assert orjson.loads(await same_on_every_host(http, stack, 18080, "configuration"))["queue_enabled"] is False
    assert orjson.loads(await same_on_every_host(http, stack, 18080, "configuration/scheduler"))["name"] == "LearningScheduler"
    for host in stack:
        r = await http.get(f"http://{host}:18080/function/fn-pigo", headers={H.BYPASS: "true"})
        assert r.status_code == 200 and r.headers[H.SCHEDULER] == "NoScheduler"
        r = await http.get(f"http://{host}:19000/list")
        assert r.text.count("alive") == len(stack) - 1
        assert sorted(p["ip"] for p in r.json()) == sorted(h for h in stack if h != host)
        assert r.headers[H.MACHINE_IP] == host
    assert (await same_on_every_host(http, stack, 19020, "")).startswith("This is p2pfaas-learner")
    parameters = orjson.loads(await same_on_every_host(http, stack, 19020, "learner/parameters"))
    assert set(parameters) == {"name", "parameters"} and parameters["parameters"]["window_size"] == 5
    for host in stack:
        r = await http.get(f"http://{host}:19020/learner/reset")
        assert r.status_code == 200 and r.content == b""


async def test_benchmark_client_invocations_with_payload_mix(stack, http):
    """DoRequest: POST with the task type and tracing id; every answer carries the learning
    headers (the client exits when one lacks them), timing lists parse as JSON arrays, a 500's
    body has an integer code."""
    async def one(i: int) -> httpx.Response:
        task_type = 0 if i % 10 < 3 else 1
        return await http.post(f"http://{stack[i % 3]}:18080/function/fn-pigo", content=PAYLOADS[task_type],
                               headers={"Content-Type": "image/jpeg", H.TASK_TYPE: str(task_type),
                                        H.TRACING_ID: f"n{i % 3}t{i}"})

    answers = await asyncio.gather(*(one(i) for i in range(60)))
    assert {r.status_code for r in answers} <= {200, 500, 503} and any(r.status_code == 200 for r in answers)
    for r in answers:
        for name in H.LEARNING:
            assert r.headers.get(name), (name, r.status_code, r.headers)
        float(r.headers[H.LEARNING_EPS]), float(r.headers[H.LEARNING_ACTION])
        if r.status_code == 200:
            total = orjson.loads(r.headers[H.TIMING_TOTAL])
            assert all(isinstance(v, float) for v in [*total, *orjson.loads(r.headers[H.TIMING_SCHEDULING])])
            float(r.headers[H.TIMING_EXECUTION])
            if r.headers.get(H.EXTERNALLY_EXECUTED) == "True":   # forwarded: origin first, IPs as P2PFaaS lists them
                ips = orjson.loads(r.headers[H.PEERS_LIST_IP])
                assert len(ips) == len(total) == int(r.headers[H.HOPS]) + 1 and set(ips) <= set(stack)
                assert len(orjson.loads(r.headers[H.TIMING_PROBING])) == len(total)
        elif r.status_code == 500:
            assert isinstance(r.json()["code"], int)
        else:
            assert r.json()["code"] == codes.DELIBERATELY_REJECTED   # action 0


async def test_learning_batches_train_the_node_model_once(stack, http):
    """LearnerBatchTrain: 20 entries, eid and action as the headers carried them (text); a batch
    sent twice counts once."""
    learner = f"http://{stack[0]}:19020"
    before = (await http.get(f"{learner}/learner/stats")).json()["p2pfaas"]["stream_seq"]
    base = 10**12 + random.randint(0, 10**9)
    batch = [{"eid": str(base + i), "state": f"{i % 2},0,1,0,0", "action": f"{i % 5:f}", "reward": float(i % 2)}
             for i in range(20)]
    for _ in range(2):
        r = await http.post(f"{learner}/train_batch", json=batch)
        assert r.status_code == 200 and r.text == "ok"
    stats = await eventually(lambda: http.get(f"{learner}/learner/stats"),
                             lambda r: r.json()["p2pfaas"]["stream_seq"] >= before + 20, 10)
    assert stats.json()["p2pfaas"]["stream_seq"] == before + 20   # the repeated batch was not stored again
    assert set(stats.json()) >= {"inferences", "trained_items", "epsilon", "episodes", "pending_entries",
                                 "eid_max_seen", "eid_last_trained"}
    r = await http.post(f"{learner}/train_batch", json=[{"eid": "x", "state": "1", "action": "1", "reward": 1}])
    assert r.status_code == 500   # P2PFaaS's learner refuses a bad batch with 500
    weights = (await http.get(f"{learner}/learner/weights")).json()
    assert set(weights) >= {"actions_map", "states_map", "table"}


# -- the Python experiment scripts (experiments/benchmark) ------------------------------------------
async def test_python_experiment_scripts_calls(stack, http):
    host = stack[1]
    load = await http.get(f"http://{host}:18080/monitoring/load")   # check_hosts reads the JSON
    assert load.json()["scheduler_name"].startswith("LearningScheduler") and load.json()["functions_running_max"] == 3
    assert load.headers[H.LOAD] == "0" and load.headers[H.MAXLOAD] == "3" and load.headers[H.P2PFOG_QUEUE_LENGTH] == "0"
    params = (await http.get(f"http://{host}:18080/configuration")).json()   # get_system_params
    assert params["parallel_running_functions_max"] == 3
    assert (await http.get(f"http://{host}:18080/")).json()["version"]
    r = await http.get(f"http://{host}:19020/train", headers={   # _learning_log_entry
        "X-P2pfaas-Learning-Eid": str(random.randint(10**9, 10**10)), "X-P2pfaas-Learning-State": "1,0,0,0,0",
        "X-P2pfaas-Learning-Action": "1.0000", "X-P2pfaas-Learning-Reward": "1.0000"})
    assert r.status_code == 200 and r.text == "ok"
    act = await http.get(f"http://{host}:19020/act", headers={"X-P2pfaas-Learning-State": "1,0,0,0,0"})
    assert act.status_code == 200 and int(act.text) >= 0 and float(act.headers[H.LEARNER_EPS]) >= 0


async def test_rejections_use_p2pfaas_codes(stack, http):
    url = f"http://{stack[2]}:18080/function/fn-pigo"
    r = await http.post(url, content=b"x", headers={H.REJECT: "true"})
    assert r.status_code == 503 and r.json()["code"] == codes.DELIBERATELY_REJECTED
    assert r.headers[H.SCHEDULER] == "RejectScheduler"
    busy = await asyncio.gather(*(http.post(url, content=bytes(200_000), headers={H.BYPASS: "true"}) for _ in range(8)))
    overloaded = [r for r in busy if r.status_code == 500]
    assert overloaded and all(r.json()["code"] == codes.CANNOT_SCHEDULE for r in overloaded)   # K=3, no queue


# -- OpenFaaS's management routes -----------------------------------------------------------------
async def test_openfaas_routes(stack, http):
    base = f"http://{stack[0]}:18080"
    listed = {f["name"]: f for f in (await http.get(f"{base}/system/functions")).json()}
    assert listed["fn-pigo"]["envProcess"] == "standin_functions:fn_pigo" and listed["fn-pigo"]["replicas"] == 3
    r = await http.post(f"{base}/system/functions", headers=stack.operator, json={"openfaas_service": {"service": "shout",
                                                                                "reference": "standin_functions:shout"}})
    assert r.status_code == 200 and r.json()["name"] == "shout"
    assert (await http.post(f"{base}/function/shout", content=b"hey", headers={H.BYPASS: "1"})).content == b"HEY"
    assert (await http.get(f"{base}/system/function/shout")).json()["availableReplicas"] == 3
    r = await http.post(f"{base}/system/scale-function/shout", headers=stack.operator,
                        json={"service": "shout", "replicas": 4})
    assert r.status_code == 200 and r.json()["replicas"] == 4
    await eventually(lambda: http.get(f"{base}/system/function/shout"), lambda r: r.json()["availableReplicas"] == 4, 30)
    delay = (await http.get(f"{base}/monitoring/scale-delay/shout", headers=stack.operator)).json()   # it scales
    assert delay["approximate_delay"] > 0 and delay["attempts"] >= 1
    # its replicas are its own (a pool of its own on that node): K, every other function's, stays 3
    assert (await http.get(f"{base}/configuration")).json()["parallel_running_functions_max"] == 3
    assert (await http.get(f"{base}/system/function/shout")).json()["labels"]["p2pfaas.pool"] == "shout"
    await http.post(f"{base}/system/scale-function/shout", headers=stack.operator, json={"replicas": 3})
    r = await http.request("DELETE", f"{base}/system/functions", headers=stack.operator, json={"functionName": "shout"})
    assert r.status_code == 200
    assert (await http.post(f"{base}/function/shout", content=b"x")).status_code == 404
    r = await http.post(f"{base}/system/functions", headers=stack.operator,
                        json={"service": "bad", "reference": "no.such:thing"})
    assert r.status_code == 400


# -- mixed clusters: an original P2PFaaS node beside p2pfaas nodes ---------------------------------
class P2PFaaSNode:
    """The HTTP side of an original P2PFaaS node: its discovery list, load and /peer/function."""

    def __init__(self, ip: str) -> None:
        self.ip, self.jobs, self.polled_by = ip, [], []
        self.app = FastAPI()

        @self.app.get("/list")
        async def machines(request: Request) -> Response:
            self.polled_by.append(request.headers.get(H.MACHINE_IP))
            return Response(b"[]", media_type="application/json", headers={H.MACHINE_IP: ip, H.MACHINE_NAME: ip})

        @self.app.get("/monitoring/load")
        async def load() -> Response:
            return Response(b"", headers={"X-P2pfaas-Load": "0", "X-P2pfaas-Maxload": "4", H.P2PFOG_QUEUE_LENGTH: "0"})

        @self.app.post("/peer/function/{fn}")
        async def peer_function(fn: str, request: Request) -> Response:
            job = await request.json()
            self.jobs.append((request.headers.get(H.USER_AGENT), job))
            body = base64.b64encode(base64.b64decode(job["payload"]).upper()).decode()
            return Response(orjson.dumps({"peers_list": [{"machine_id": ip, "machine_ip": ip, "timings": {
                "execution_time": 0.01, "total_time": 0.02, "scheduling_time": 0.001}}], "body": body,
                "status_code": 200}), media_type="application/json")

    @contextlib.asynccontextmanager
    async def serving(self, ports=(18080, 19000)):
        servers = [uvicorn.Server(uvicorn.Config(self.app, host=self.ip, port=p, log_level="warning", lifespan="off"))
                   for p in ports]
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        await wait_until(lambda: all(s.started for s in servers), 10)
        try:
            yield self
        finally:
            for s in servers:
                s.should_exit = True
            await asyncio.gather(*tasks)


async def test_mixed_cluster_both_ways(stack, http):
    fake = P2PFaaSNode(stack[0].rsplit(".", 1)[0] + ".9")
    n1 = f"http://{stack[0]}"
    async with fake.serving():
        # it polls our discovery as a Machine: it joins our peers, and we poll it back
        r = await http.get(f"{n1}:19000/list", headers={H.USER_AGENT: H.USER_AGENT_MACHINE, H.MACHINE_IP: fake.ip,
                                                         H.MACHINE_NAME: fake.ip, H.MACHINE_GROUP: "g"})
        assert r.headers[H.MACHINE_IP] == stack[0]
        listed = r.json()   # as P2PFaaS: the list it gets already has it
        assert {"ip": fake.ip, "alive": True, "protocol": "http"}.items() <= next(
            p for p in listed if p["ip"] == fake.ip).items()
        await wait_until(lambda: stack[0] in fake.polled_by, 10)
        # our slave n1 sends client requests to its master named by IP: the P2PFaaS node
        r = await http.post(f"{n1}:18080/configuration/scheduler", headers=stack.operator,
                            json={"name": "RoundRobinWithMasterScheduler", "parameters": ["false", fake.ip, "true"]})
        assert r.status_code == 200
        try:
            r = await http.post(f"{n1}:18080/function/echo", content=b"mixed")
        finally:
            await http.post(f"{n1}:18080/configuration/scheduler", headers=stack.operator,
                            json={"name": "LearningScheduler", "parameters": ["2"]})
        assert r.status_code == 200 and r.content == b"MIXED"
        assert r.headers[H.EXTERNALLY_EXECUTED] == "True" and r.headers[H.HOPS] == "1"
        assert orjson.loads(r.headers[H.PEERS_LIST_IP]) == [stack[0], fake.ip]
        agent, job = fake.jobs[-1]
        assert agent == H.USER_AGENT_MACHINE and base64.b64decode(job["payload"]) == b"mixed" and job["hops"] == 1
        await http.get(f"{n1}:19000/reset")
    # and the other way: it forwards a job to one of our nodes
    r = await http.post(f"http://{stack[1]}:18080/peer/function/echo", headers={H.USER_AGENT: H.USER_AGENT_MACHINE},
                        json={"service_id_request": 7, "service_id_tracing": "t7", "function_name": "echo", "hops": 1,
                              "peers_list": [], "payload": base64.b64encode(b"from p2pfaas-go").decode(),
                              "content_type": "text/plain", "headers": {}})
    reply = r.json()
    assert r.status_code == 200 and reply["status_code"] == 200
    assert base64.b64decode(reply["body"]) == b"from p2pfaas-go"
    assert [p["machine_ip"] for p in reply["peers_list"]] == [stack[1]]
    assert reply["peers_list"][0]["timings"]["execution_time"] >= 0
    r = await http.post(f"http://{stack[1]}:18080/peer/function/echo", json={})
    assert r.status_code == 500   # only machines may call it


async def test_original_benchmark_client_runs_clean(stack, tmp_path, http):
    binary = await asyncio.to_thread(build_benchmark_client, tmp_path)
    (tmp_path / "hosts.txt").write_text("\n".join(stack) + "\n")
    before = [(await http.get(f"http://{h}:19020/learner/stats")).json()["p2pfaas"]["stream_seq"] for h in stack]
    proc = await asyncio.create_subprocess_exec(*documented_command_line(binary), "-benchmark-time", "10",
                                                cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    output = (await asyncio.wait_for(proc.communicate(), 90))[0].decode(errors="replace")
    assert proc.returncode == 0, output[-3000:]
    assert "Benchmark ended" in output and "res=200" in output
    assert not [line for line in output.splitlines() if " ERRO" in line or " CRIT" in line], output[-3000:]
    after = [(await http.get(f"http://{h}:19020/learner/stats")).json()["p2pfaas"]["stream_seq"] for h in stack]
    assert all(a >= b + 20 for a, b in zip(after, before)), (before, after)   # its batches trained every node
