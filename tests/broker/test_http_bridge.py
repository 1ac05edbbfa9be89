"""The HTTP bridge (P2PFaaS REST) against a real node over a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import AsyncIterator

import orjson
import pytest
import uvicorn
from fastapi import FastAPI, Request

from broker import headers as H
from broker.answers import input_limit, output_limit
from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer, free_port
from broker.errors import PayloadTooLarge
from broker.http.limits import HttpLimits
from broker.http_bridge import HttpBridge
from nodes.node import Node
from nodes.settings import NodeSettings
from support import eventually, serving, wait_until


@dataclass
class CallbackReceiver:
    """A local receiver of ``X-Callback-Url`` POSTs: what came, in order, as (headers, body)."""

    url: str
    received: list[tuple[dict[str, str], bytes]]


@pytest.fixture
async def callbacks() -> AsyncIterator[CallbackReceiver]:
    received: list[tuple[dict[str, str], bytes]] = []
    app = FastAPI()

    @app.post("/cb")
    async def cb(request: Request) -> dict:
        received.append((dict(request.headers), await request.body()))
        return {}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started)
    try:
        yield CallbackReceiver(f"http://127.0.0.1:{port}/cb", received)
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def http(node_factory, nc, prefix):
    async with node_factory(k=2, queue=2):
        async with serving(HttpBridge(nc, "n1", prefix=prefix, max_payload_bytes=4096, invoke_timeout_s=5,
                                      callback_hosts=["127.0.0.1"])) as client:
            yield client


async def test_sync_invoke_returns_output_and_p2pfaas_headers(http):
    r = await http.post("/function/fib", content=b"25")
    assert r.status_code == 200 and r.content == b"75025"
    assert r.headers[H.VERSION] and r.headers[H.SCHEDULER] == "NoScheduler"
    assert r.headers[H.CALL_ID]
    for name in (H.TIMING_TOTAL, H.TIMING_SCHEDULING):
        values = orjson.loads(r.headers[name])
        assert isinstance(values, list) and len(values) == 1 and values[0] >= 0
    assert H.TIMING_PROBING not in r.headers   # nothing was probed (P2PFaaS sends none then)
    assert float(r.headers[H.TIMING_EXECUTION]) > 0
    assert (await http.get("/function/echo", params={})).status_code == 200  # GET works too


async def test_errors_map_to_statuses_with_json_bodies(http):
    cases = [   # HTTP status, P2PFaaS's code (broker/codes.py)
        (("/function/nope", b"1"), 404, 3),
        (("/function/fib", b""), 400, 4),
        (("/function/fib", b"abc"), 400, 4),
        (("/function/echo", b"x" * 5000), 413, 4),
        (("/function/bad%20name", b"1"), 400, 4),
    ]
    for (path, body), status, code in cases:
        r = await http.post(path, content=body)
        assert r.status_code == status, path
        assert set(r.json()) == {"code", "message"} and r.json()["message"] and r.json()["code"] == code, path
    r = await http.post("/function/sleep", content=b"3", headers={H.TIMEOUT: "0.2"})
    assert r.status_code == 504 and "timeout" in r.json()["message"]
    r = await http.post("/function/sleep", content=b"0.1", headers={H.TIMEOUT: "30"})   # the bridge waits 5 s
    assert r.status_code == 400 and "/async-function/sleep" in r.json()["message"] and r.json()["code"] == 4
    r = await http.post("/function/echo", content=b"x", headers={H.REJECT: "true"})
    assert r.status_code == 503 and r.headers["Retry-After"] and r.json()["code"] == 401


async def test_overload_is_500_job_cannot_be_scheduled(http):
    rs = await asyncio.gather(*(http.post("/function/sleep", content=b"0.5") for _ in range(6)))
    statuses = sorted(r.status_code for r in rs)
    assert statuses == [200, 200, 200, 200, 500, 500]  # K=2 + queue 2; P2PFaaS: 500 {"code": 400}
    overloaded = [r for r in rs if r.status_code == 500]
    assert all(r.json()["code"] == 400 and r.headers.get("Retry-After") for r in overloaded)


async def test_a_call_still_queued_after_the_wait_its_caller_gave_is_504_not_run(node_factory, nc, prefix):
    """X-P2pfaas-Wait-Seconds: how long the HTTP caller waits; a call not started by then is not run."""
    async with node_factory(k=2, queue=2) as node:
        async with serving(HttpBridge(nc, "n1", prefix=prefix, invoke_timeout_s=5)) as http:
            busy = [asyncio.create_task(http.post("/function/sleep", content=b"1.5")) for _ in range(2)]   # K=2
            await wait_until(lambda: node.scheduler.main.n_running == 2, 10)
            r = await http.post("/function/sleep", content=b"1", headers={H.WAIT: "0.3"})
            assert r.status_code == 504 and "stopped waiting" in r.json()["message"]
            assert [b.status_code for b in await asyncio.gather(*busy)] == [200, 200]


async def test_async_invoke_result_and_callback(http, callbacks):
    r = await http.post("/async-function/fib", content=b"20", headers={H.CALLBACK_URL: callbacks.url})
    assert r.status_code == 202
    call_id = r.headers[H.CALL_ID]
    await wait_until(lambda: bool(callbacks.received), timeout_s=15)
    headers, body = callbacks.received[0]
    assert body == b"6765" and headers[H.CALL_ID.lower()] == call_id
    stored = await http.get(f"/result/{call_id}")
    assert stored.status_code == 200 and stored.content == b"6765"
    assert (await http.get("/result/unknown123")).status_code == 404
    pending = await http.post("/async-function/sleep", content=b"1")
    assert (await http.get(f"/result/{pending.headers[H.CALL_ID]}")).status_code == 202
    for bad in ("http://[::1", "http://127.0.0.1:abc/cb", "http://127.0.0.1:99999/cb"):   # no URL: 400 at once
        r = await http.post("/async-function/fib", content=b"20", headers={H.CALLBACK_URL: bad})
        assert r.status_code == 400 and "X-Callback-Url" in r.json()["message"], (bad, r.text)
    r = await http.post("/async-function/fib", content=b"20", headers={H.CALLBACK_URL: "http://10.9.9.9/cb"})
    assert r.status_code == 403   # a URL, to a host the operator did not allow


async def test_load_configuration_health_metrics_and_docs(http):
    r = await http.get("/monitoring/load")
    assert r.status_code == 200 and r.headers[H.MAXLOAD] == "2" and r.headers[H.LOAD] == "0"
    assert r.headers[H.P2PFOG_QUEUE_LENGTH] == "0" and r.json()["scheduler_name"] == "NoScheduler"
    assert r.json()["queue_length_max"] == 2
    r = await http.post("/configuration", json={"parallel_running_functions_max": 3, "queue_length_max": 1, "queue_enabled": True})
    assert r.status_code == 200
    assert (await http.get("/configuration")).json()["parallel_running_functions_max"] == 3
    r = await http.post("/configuration", content=b"{not json")
    assert r.status_code == 400 and r.json()["code"] == 4
    r = await http.post("/configuration", json={"queue_enabled": False, "unknown": 1})  # P2PFaaS: merged, unknown ignored
    assert r.status_code == 200
    assert (await http.get("/configuration")).json() == {"parallel_running_functions_max": 3, "queue_length_max": 1,
                                                         "queue_enabled": False}
    r = await http.post("/configuration/scheduler", json={"name": "NoSuchScheduler", "parameters": []})
    assert r.status_code == 400 and "NoScheduler" in r.json()["message"]
    r = await http.post("/configuration/scheduler", json={"name": "PowerOfNScheduler"})   # no parameters: its defaults
    assert r.status_code == 200 and r.json() == {"name": "PowerOfNScheduler", "parameters": ["1", "2", "true", "1"]}
    r = await http.post("/configuration/scheduler", json={"name": "PowerOfNScheduler", "parameters": ["1"]})
    assert r.status_code == 400 and "got ['1']" in r.json()["message"]   # what was sent, not a default
    r = await http.post("/configuration/scheduler", json={"name": "NoScheduler", "parameters": ["false"]})
    assert r.status_code == 200
    assert (await http.post("/function/echo", content=b"x")).headers[H.SCHEDULER] == "NoScheduler"
    health = await http.get("/healthz")
    assert health.status_code == 200 and health.json()["node"]["node"] == "n1"
    metrics = (await http.get("/metrics")).text
    assert "p2pfaas_requests_total" in metrics and "p2pfaas_http_requests_total" in metrics
    assert 'kind="bad_configuration"' in metrics
    assert "/function/{fn}" in (await http.get("/openapi.json")).json()["paths"]
    assert (await http.get("/docs")).status_code == 200


async def test_bridge_answers_503_when_node_is_down(nc, prefix, node_factory):
    async with node_factory():
        pass  # streams exist, node stopped
    async with serving(HttpBridge(nc, "n1", prefix=prefix, invoke_timeout_s=30)) as http:
        assert (await http.get("/healthz")).status_code == 503
        assert (await http.get("/monitoring/load")).status_code == 503
        started = asyncio.get_running_loop().time()
        r = await http.post("/function/echo", content=b"x")   # direct: fails at once, not at the timeout
        assert r.status_code == 503 and r.headers["Retry-After"] and "not running" in r.json()["message"]
        assert asyncio.get_running_loop().time() - started < 2
        r = await http.post("/async-function/echo", content=b"x")   # async: stored, runs when the node returns
        assert r.status_code == 202 and r.headers[H.CALL_ID]
        call_id = r.headers[H.CALL_ID]
        assert (await http.get(f"/result/{call_id}")).status_code == 202   # pending
        async with node_factory():
            r = await eventually(lambda: http.get(f"/result/{call_id}"), lambda r: r.status_code == 200)
        assert r.content == b"x"


async def test_health_is_503_when_the_node_answers_its_info_request_with_an_error(nc, prefix, nats_server):
    """A node whose info handler fails answers 500 on its info subject: not healthy, for the
    bridge's /healthz and for the containers' health check alike (one judgement: node_health)."""
    from broker.control import ControlError, ControlServer
    from broker.subjects import Subjects
    from p2pfaas.healthcheck import node_answers

    answers = {"info": b""}

    async def info(_: bytes) -> bytes:
        if not answers["info"]:
            raise RuntimeError("the node's info handler is broken")
        if answers["info"] == b"refuse":
            raise ControlError(503, "not ready")
        return answers["info"]

    server = ControlServer(nc)
    await server.serve(Subjects(prefix).info("n1"), info)
    env = {"P2PFAAS_NATS_URL": nats_server.url, "P2PFAAS_PREFIX": prefix}
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            async with serving(HttpBridge(nc, "n1", prefix=prefix, control_timeout_s=2)) as http:
                for broken, why in ((b"", "500"), (b"refuse", "503: not ready")):
                    answers["info"] = broken
                    r = await http.get("/healthz")
                    assert r.status_code == 503 and why in r.json()["message"], r.text
                    assert await node_answers("n1") is False
                answers["info"] = orjson.dumps({"node": "n1", "intake": "ok", "answers_unstored": 0})
                r = await http.get("/healthz")
                assert r.status_code == 200 and r.json()["node"]["node"] == "n1"
                assert await node_answers("n1") is True
                answers["info"] = orjson.dumps({"node": "n1", "intake": "unhealthy", "answers_unstored": 0})
                assert "intake" in (await http.get("/healthz")).json()["message"]
                assert await node_answers("n1") is False
    finally:
        await server.stop()


async def test_result_is_503_when_the_stored_answers_cannot_be_read():
    """A broker without JetStream (or with JetStream away): /result says 503 + Retry-After and
    FaasClient.stored_answer raises BrokerUnavailable -- not a plain 500, not "unknown". So does
    a JetStream that takes the questions and answers none (overloaded), within the bridge's bound."""
    import subprocess

    from broker.client import FaasClient
    from broker.connection import close_quietly, connect
    from broker.embedded import find_binary
    from broker.errors import BrokerUnavailable

    port = free_port()
    server = subprocess.Popen([find_binary("nats-server"), "-a", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)   # no -js
    try:
        for _ in range(100):   # until it listens (bounded: 10 s)
            try:
                nc = await connect(f"nats://127.0.0.1:{port}", "no-jetstream")
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("nats-server without JetStream did not start")
        try:
            async with FaasClient(nc, client="http-n1", prefix="nojs") as faas:
                with pytest.raises(BrokerUnavailable, match="cannot be read now"):
                    await faas.stored_answer("http-n1", "abc123")
            async with serving(HttpBridge(nc, "n1", prefix="nojs", control_timeout_s=1)) as http:
                r = await http.get("/result/abc123")
                assert r.status_code == 503 and r.headers["Retry-After"] and "try again" in r.json()["message"], r.text

                async def never_answer(msg) -> None:
                    pass

                await nc.subscribe("$JS.API.>", cb=never_answer)
                started = asyncio.get_running_loop().time()
                r = await http.get("/result/abc123")
                assert r.status_code == 503 and r.headers["Retry-After"] and "try again" in r.json()["message"], r.text
                assert asyncio.get_running_loop().time() - started < 3   # its 1 s, not 5 s per look at JetStream
        finally:
            await close_quietly(nc)
    finally:
        server.terminate()
        server.wait(10)


async def test_a_control_change_that_cannot_be_saved_says_why(nc, prefix):
    """A handler that cannot write the node's state (a full disk) answers 500 with the system's
    reason and the file, not a bare "internal error: OSError" and a traceback in the log."""
    import errno

    from broker.control import ControlServer, control_request
    from broker.subjects import Subjects

    async def full(_: bytes) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/nodes/n1/configuration.json")

    subject = Subjects(prefix).config("n1", "set")
    server = ControlServer(nc)
    await server.serve(subject, full)
    try:
        status, body = await control_request(nc, subject, b"{}", timeout_s=10)
    finally:
        await server.stop()
    assert status == 500 and orjson.loads(body)["message"] == (
        "the node could not write its state: No space left on device (/data/nodes/n1/configuration.json)")


async def test_a_callback_comes_for_an_async_call_longer_than_a_direct_call_may_take(node_factory, nc, prefix,
                                                                                     callbacks):
    """A direct call's limit is no async call's: the answer of a call that ran longer (queued,
    or a long function, as the 400 of a too-long direct call advises) is still POSTed, and so is
    one whose answer the bridge missed (a reconnection): it is looked up in the results stream.
    A call without a callback holds nothing in the bridge while it runs."""
    received = callbacks.received
    async with node_factory(), serving(bridge := HttpBridge(nc, "n1", prefix=prefix, invoke_timeout_s=1,
                                                            callback_hosts=["127.0.0.1"],
                                                            limits=HttpLimits(callback_look_s=0.5))) as http:
        r = await http.post("/async-function/sleep", content=b"0.3")
        assert r.status_code == 202 and not bridge._background and not bridge.faas._waiting
        r = await http.post("/async-function/sleep", content=b"2", headers={H.CALLBACK_URL: callbacks.url})
        assert r.status_code == 202
        await wait_until(lambda: bool(received), timeout_s=10)
        await wait_until(lambda: not bridge._background and not bridge.faas._waiting, timeout_s=5)
        r = await http.post("/async-function/echo", content=b"missed", headers={H.CALLBACK_URL: callbacks.url})
        bridge.faas._waiting.clear()   # its answer goes by while the bridge is not listening
        await wait_until(lambda: len(received) == 2, timeout_s=10)
    assert received[1][1] == b"missed"


async def test_a_callback_target_that_trickles_its_response_is_cut_off(node_factory, nc, prefix):
    """httpx's timeout is per read: a target sending a byte now and then would hold the callback's
    task (and its connection) for ever; the whole POST has a deadline."""
    posted = asyncio.Event()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        posted.set()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.2)

    server = await asyncio.start_server(trickle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with node_factory(), serving(bridge := HttpBridge(nc, "n1", prefix=prefix, callback_hosts=["127.0.0.1"],
                                                                limits=HttpLimits(callback_post_s=1.0))) as http:
            r = await http.post("/async-function/echo", content=b"1",
                                headers={H.CALLBACK_URL: f"http://127.0.0.1:{port}/cb"})
            assert r.status_code == 202
            await asyncio.wait_for(posted.wait(), 10)
            await wait_until(lambda: not bridge._background, timeout_s=4)
    finally:
        server.close()


async def test_a_body_that_cannot_travel_with_its_headers_is_413_and_the_bridge_keeps_its_connection(prefix, tmp_path):
    """Against a nats-server with a smaller max_payload than the bridge's limit (a stock server
    takes 1 MiB, the bridge's default limit): a body that fitted the bridge's limit but not the
    server's once headers were added made nats-server close the bridge's NATS connection for good,
    and every later call was 503 until a restart. Now it is 413, and the bridge goes on serving."""
    server = NatsServer(data_dir=tmp_path / "nats", port=None, max_payload=256 * 1024)
    await server.start()
    node = nc = None
    try:
        node = await Node(NodeSettings(node_id="n1", nats_url=server.url, prefix=prefix, data_dir=tmp_path / "node",
                                       learner=False, runtime="inprocess")).start()
        assert node.pool is not None
        await node.pool.wait_ready(30)
        nc = await connect(server.url, "bridge")
        async with serving(HttpBridge(nc, "n1", prefix=prefix, max_payload_bytes=1024 * 1024, invoke_timeout_s=10)) as http:
            limit = input_limit(256 * 1024)
            for size in (256 * 1024 - 100, limit + 1):
                for path in ("/function/echo", "/async-function/echo"):
                    r = await http.post(path, content=b"x" * size)
                    assert r.status_code == 413 and f"limit of {limit}" in r.json()["message"], (path, size, r.text)
            big = b"y" * output_limit(256 * 1024)   # travels both ways
            r = await http.post("/function/echo", content=big)
            assert r.status_code == 200 and r.content == big
            r = await http.post("/async-function/echo", content=b"ok")
            assert r.status_code == 202
            call_id = r.headers[H.CALL_ID]
            r = await eventually(lambda: http.get(f"/result/{call_id}"), lambda r: r.status_code == 200)
            assert r.content == b"ok" and nc.is_connected
        faas = await FaasClient(nc, prefix=prefix, client="dev1").start()   # a Python client is told too
        try:
            with pytest.raises(PayloadTooLarge):
                await faas.invoke("n1", "echo", b"z" * (limit + 1), timeout_s=5)
            assert (await faas.invoke("n1", "echo", b"ok", timeout_s=10)).status == 200
        finally:
            await faas.stop()
    finally:
        if nc is not None:
            await close_quietly(nc)
        if node is not None:
            await node.stop()
        await server.stop()
