"""The HTTP bridge: P2PFaaS's REST API (default :18080) translated to NATS subjects.

It imports nothing from nodes/: every route is a publish or a request/reply on
the node's subjects, so a node can run anywhere its NATS reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

import httpx
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import Error as JetStreamError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from broker import headers as H
from broker.client import Answer, FaasClient, new_request_id
from broker.errors import InvalidToken
from broker.subjects import Subjects, check_token
from broker.codec import decode, encode
from broker.errors import ContractError
from broker.messages import LearnerAction, LearnerActRequest, LearnerTrainBatch, LearnerTrainSample, SchedulingExperience
from broker.subjects import SCHEDULING_MODEL, LearnerVerb

log = logging.getLogger(__name__)

VERSION = "0.1.0"
STATUS_HEADER = "X-P2pfaas-Status"
PASS_THROUGH = (H.BYPASS, H.FORWARD, H.REJECT, H.TRACING_ID, H.TASK_TYPE, H.TIMEOUT, H.DEADLINE)
REMEMBERED_CALLS = 100_000
LEARNING_HEADER = "X-P2pfaas-Learning-"     # + Eid, State, Action, Reward (P2PFaaS learner API)
LEARNING_EPS = "X-P2pfaas-Eps"


def error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers or None)


def answer_response(answer: Answer, call_id: str) -> Response:
    """HTTP response of a result or rejection, with the P2PFaaS headers."""
    hdrs = {H.VERSION: VERSION, H.CALL_ID: call_id}
    if answer.rejection is not None:
        rej = answer.rejection
        hdrs[H.SCHEDULER] = rej.scheduler
        if rej.retry_after_s is not None:
            hdrs["Retry-After"] = str(max(1, round(rej.retry_after_s)))
        if rej.learning is not None:
            hdrs.update(rej.learning.headers())
        return JSONResponse({"code": rej.code, "message": rej.reason}, status_code=rej.http_status, headers=hdrs)
    res = answer.result
    assert res is not None
    hops = res.hop_timings
    hdrs.update({
        H.SCHEDULER: res.scheduler,
        H.TIMING_TOTAL: orjson.dumps([h.total_s for h in hops] or [res.timings.total_s]).decode(),
        H.TIMING_SCHEDULING: orjson.dumps([h.scheduling_s for h in hops] or [res.timings.scheduling_s]).decode(),
        H.TIMING_PROBING: orjson.dumps([h.probing_s for h in hops] or [0.0]).decode(),
        H.TIMING_EXECUTION: repr(res.timings.execution_s),
        "X-P2pfaas-Timing-Queueing-Seconds": repr(res.timings.queueing_s),
        "X-P2pfaas-Executed-By": res.executed_by,
    })
    if res.hops > 0:
        hdrs.update({H.EXTERNALLY_EXECUTED: "True", H.HOPS: str(res.hops), H.PEERS_LIST_ID: ",".join(res.peers)})
    if res.learning is not None:
        hdrs.update(res.learning.headers())
    if res.status != 200:
        return JSONResponse({"code": res.status, "message": res.error or "function failed"},
                            status_code=res.status, headers=hdrs)
    return Response(answer.output, status_code=200, headers=hdrs, media_type="application/octet-stream")


class HttpBridge:
    """Owns the FastAPI app for one node; ``serve()`` runs uvicorn inside the caller's loop."""

    def __init__(self, nc: Client, node: str, *, prefix: str = "faas", max_payload_bytes: int = 1024 * 1024,
                 invoke_timeout_s: float = 60.0, control_timeout_s: float = 3.0) -> None:
        self.nc = nc
        self.node = check_token(node, "node")
        self.subjects = Subjects(prefix)
        self.client_id = f"http-{node}"
        self.faas = FaasClient(nc, client=self.client_id, prefix=prefix)
        self.max_payload_bytes = max_payload_bytes
        self.invoke_timeout_s = invoke_timeout_s
        self.control_timeout_s = control_timeout_s
        self.calls: OrderedDict[str, None] = OrderedDict()   # async call ids issued here
        self.background: set[asyncio.Task] = set()
        self.registry = CollectorRegistry()
        self.http_requests = Counter("p2pfaas_http_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.http_latency = Histogram("p2pfaas_http_seconds", "HTTP request latency", ["route"], registry=self.registry)
        self.app = self._build_app()
        self._server: uvicorn.Server | None = None

    async def start(self) -> "HttpBridge":
        await self.faas.start()
        return self

    async def stop(self) -> None:
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)
        await self.faas.stop()

    # -- serving --------------------------------------------------------------
    async def serve(self, host: str, port: int, started: asyncio.Event | None = None) -> None:
        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning", lifespan="off",
                                access_log=False, timeout_graceful_shutdown=5)
        self._server = _EmbeddedServer(config)
        task = asyncio.create_task(self._server.serve())
        while not self._server.started and not task.done():
            await asyncio.sleep(0.01)
        if started:
            started.set()
        await task

    def shutdown(self) -> None:
        if self._server:
            self._server.should_exit = True

    # -- helpers ----------------------------------------------------------------
    async def _control(self, subject: str, body: bytes = b"") -> Response:
        try:
            msg = await self.nc.request(subject, body, timeout=self.control_timeout_s)
        except (NatsTimeout, NoRespondersError, asyncio.TimeoutError):
            return error(503, f"node {self.node} did not answer on {subject}")
        status = int((msg.headers or {}).get(STATUS_HEADER, 200))
        return Response(msg.data, status_code=status, media_type="application/json")

    async def _read_body(self, request: Request) -> bytes | Response:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_payload_bytes:
            return error(413, f"payload of {declared} bytes exceeds the limit of {self.max_payload_bytes}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_payload_bytes:
                return error(413, f"payload exceeds the limit of {self.max_payload_bytes} bytes")
        return bytes(body)

    def _forwarded_headers(self, request: Request) -> dict[str, str]:
        return {name: request.headers[name] for name in PASS_THROUGH if name in request.headers}

    def _remember(self, call_id: str) -> None:
        self.calls[call_id] = None
        if len(self.calls) > REMEMBERED_CALLS:
            self.calls.popitem(last=False)

    async def _deliver_callback(self, fut: "asyncio.Future[Answer]", call_id: str, url: str | None) -> None:
        try:
            answer = await asyncio.wait_for(fut, self.invoke_timeout_s)
        except asyncio.TimeoutError:
            log.warning("async call %s got no answer within %.0f s", call_id, self.invoke_timeout_s)
            return
        finally:
            self.faas.forget(call_id)
        if not url:
            return
        response = answer_response(answer, call_id)
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                await client.post(url, content=response.body, headers=dict(response.headers.items()))
        except httpx.HTTPError as exc:
            log.warning("callback %s for %s failed: %s", url, call_id, exc)

    # -- routes -----------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        app = FastAPI(title="p2pfaas HTTP bridge", version=VERSION,
                      description="P2PFaaS-compatible REST entrypoint of a p2pfaas node, bridged to NATS.")
        bridge = self

        app.add_middleware(RequestMetrics, bridge=bridge)

        @app.get("/", summary="Name and version")
        async def root() -> dict[str, str]:
            return {"name": "p2pfaas", "version": VERSION, "version_commit": "", "node": bridge.node}

        @app.get("/function/{fn}", summary="Invoke a function synchronously", operation_id="invoke_get")
        @app.post("/function/{fn}", summary="Invoke a function synchronously", operation_id="invoke_post")
        async def invoke(fn: str, request: Request) -> Response:
            try:
                check_token(fn, "function")
            except InvalidToken as exc:
                return error(400, str(exc))
            body = await bridge._read_body(request)
            if isinstance(body, Response):
                return body
            call_id = new_request_id()
            try:
                answer = await bridge.faas.invoke(bridge.node, fn, body, req=call_id,
                                                  headers=bridge._forwarded_headers(request),
                                                  timeout_s=bridge.invoke_timeout_s)
            except asyncio.TimeoutError:
                bridge._remember(call_id)
                return error(504, f"no result within {bridge.invoke_timeout_s:g} s; poll /result/{call_id}",
                             **{H.CALL_ID: call_id})
            except (NatsTimeout, NoRespondersError) as exc:
                return error(503, f"request not accepted by the broker: {exc}", **{"Retry-After": "1"})
            return answer_response(answer, call_id)

        @app.post("/async-function/{fn}", status_code=202, summary="Invoke asynchronously; 202 + X-Call-Id")
        async def invoke_async(fn: str, request: Request) -> Response:
            try:
                check_token(fn, "function")
            except InvalidToken as exc:
                return error(400, str(exc))
            body = await bridge._read_body(request)
            if isinstance(body, Response):
                return body
            call_id = new_request_id()
            fut = bridge.faas.expect(call_id)
            try:
                await bridge.faas.submit(bridge.node, fn, body, call_id, bridge._forwarded_headers(request))
            except (NatsTimeout, NoRespondersError) as exc:
                bridge.faas.forget(call_id)
                return error(503, f"request not accepted by the broker: {exc}", **{"Retry-After": "1"})
            bridge._remember(call_id)
            task = asyncio.create_task(bridge._deliver_callback(fut, call_id, request.headers.get(H.CALLBACK_URL)))
            bridge.background.add(task)
            task.add_done_callback(bridge.background.discard)
            return JSONResponse({"call_id": call_id, "status": "accepted",
                                 "result_url": f"/result/{call_id}",
                                 "result_topic": bridge.subjects.result(bridge.client_id, call_id)},
                                status_code=202, headers={H.CALL_ID: call_id})

        @app.get("/result/{call_id}", summary="Fetch the result of an async call")
        async def result(call_id: str) -> Response:
            try:
                check_token(call_id, "call id")
            except InvalidToken as exc:
                return error(400, str(exc))
            answer = await bridge.faas.stored_answer(bridge.client_id, call_id)
            if answer is not None:
                return answer_response(answer, call_id)
            if call_id in bridge.calls:
                return JSONResponse({"call_id": call_id, "status": "pending"}, status_code=202,
                                    headers={H.CALL_ID: call_id, "Retry-After": "1"})
            return error(404, f"no result for call {call_id} (unknown, or older than the result retention)")

        @app.get("/monitoring/load", summary="Running and queued functions (P2PFaaS headers + JSON)")
        async def load() -> Response:
            response = await bridge._control(bridge.subjects.load(bridge.node))
            if response.status_code == 200:
                data: dict[str, Any] = orjson.loads(response.body)
                response.headers[H.LOAD] = str(data["running"])
                response.headers[H.MAXLOAD] = str(data["parallel_running_functions_max"])
                response.headers[H.QUEUE_LENGTH] = str(data["queued"])
            return response

        @app.get("/configuration", summary="Node configuration")
        async def get_configuration() -> Response:
            return await bridge._control(bridge.subjects.config(bridge.node, "get"))

        @app.post("/configuration", summary="Change K / queue at run time (persisted)")
        async def set_configuration(request: Request) -> Response:
            return await bridge._control(bridge.subjects.config(bridge.node, "set"), await request.body())

        @app.get("/configuration/scheduler", summary="Scheduling algorithm")
        async def get_scheduler() -> Response:
            return await bridge._control(bridge.subjects.scheduler_config(bridge.node, "get"))

        @app.post("/configuration/scheduler", summary="Change the scheduling algorithm (persisted)")
        async def set_scheduler(request: Request) -> Response:
            return await bridge._control(bridge.subjects.scheduler_config(bridge.node, "set"), await request.body())

        @app.get("/list", summary="Alive peers (P2PFaaS discovery format)")
        async def peer_list() -> Response:
            return await bridge._control(bridge.subjects.peers(bridge.node))

        @app.get("/healthz", summary="Liveness: broker connected and node answering")
        async def healthz() -> Response:
            if not bridge.nc.is_connected:
                return error(503, "not connected to NATS")
            response = await bridge._control(bridge.subjects.info(bridge.node))
            if response.status_code != 200:
                return error(503, f"node {bridge.node} not answering")
            return JSONResponse({"status": "ok", "node": orjson.loads(response.body)})

        @app.get("/metrics", summary="Prometheus metrics (bridge + node)")
        async def metrics() -> Response:
            text = generate_latest(bridge.registry)
            with contextlib.suppress(NatsTimeout, NoRespondersError, asyncio.TimeoutError):
                msg = await bridge.nc.request(bridge.subjects.metrics(bridge.node), b"", timeout=bridge.control_timeout_s)
                text += msg.data
            return Response(text, media_type=CONTENT_TYPE_LATEST)

        bridge._learner_routes(app)
        return app

    # -- P2PFaaS learner API (docs/learner.md) -----------------------------------
    def _learner_routes(self, app: FastAPI) -> None:
        """/learner/*: act and control are request/reply with the node's learner; train and
        train_batch store experiences on the node's durable reward stream (JetStream ack)."""
        bridge = self

        def learner_subject(model: str, verb: LearnerVerb) -> str | Response:
            try:
                return bridge.subjects.learner(bridge.node, model, verb)
            except InvalidToken as exc:
                return error(400, str(exc))

        async def control(model: str, verb: LearnerVerb, body: bytes = b"") -> Response:
            subject = learner_subject(model, verb)
            return subject if isinstance(subject, Response) else await bridge._control(subject, body)

        async def store(samples: list[LearnerTrainSample]) -> Response:
            js = bridge.nc.jetstream()
            subject = bridge.subjects.reward(bridge.node)
            try:
                for i in range(0, len(samples), 256):  # pipelined, a bounded number in flight
                    await asyncio.gather(*(js.publish(subject, encode(SchedulingExperience(
                        eid=s.eid, state=s.state, action=s.action, reward=s.reward, node=bridge.node)))
                        for s in samples[i:i + 256]))
            except (NatsTimeout, NoRespondersError, JetStreamError, asyncio.TimeoutError) as exc:
                return error(503, f"experiences of {bridge.node} not stored: {exc!r}", **{"Retry-After": "1"})
            return Response("ok", media_type="text/plain")

        @app.get("/learner/act", summary="P2PFaaS learner: action for X-P2pfaas-Learning-State (+ X-P2pfaas-Eps)")
        async def learner_act(request: Request, model: str = SCHEDULING_MODEL, explore: bool = True) -> Response:
            state = request.headers.get(LEARNING_HEADER + "State")
            if state is None:
                return error(400, f"missing header {LEARNING_HEADER}State: \"f1,f2,...\"")
            try:
                body = encode(decode(LearnerActRequest, orjson.dumps({"state": state, "explore": explore})))
            except ContractError as exc:
                return error(400, str(exc))
            response = await control(model, "act", body)
            if response.status_code != 200:
                return response
            action = decode(LearnerAction, response.body)
            return Response(str(action.action), media_type="text/plain", headers={LEARNING_EPS: repr(action.eps)})

        @app.get("/learner/train", summary="P2PFaaS learner: one sample from X-P2pfaas-Learning-{Eid,State,Action,Reward}")
        async def learner_train(request: Request) -> Response:
            names = ("Eid", "State", "Action", "Reward")
            missing = [LEARNING_HEADER + n for n in names if LEARNING_HEADER + n not in request.headers]
            if missing:
                return error(400, f"missing header(s) {', '.join(missing)}")
            fields = {n.lower(): request.headers[LEARNING_HEADER + n] for n in names}
            try:
                sample = decode(LearnerTrainSample, orjson.dumps(fields))
            except ContractError as exc:
                return error(400, str(exc))
            return await store([sample])

        @app.post("/learner/train_batch", summary="P2PFaaS learner: JSON list of {eid, state, action, reward}")
        async def learner_train_batch(request: Request) -> Response:
            body = await bridge._read_body(request)
            if isinstance(body, Response):
                return body
            try:
                batch = decode(LearnerTrainBatch, body)
            except ContractError as exc:
                return error(400, str(exc))
            return await store(batch.root)

        @app.get("/learner/parameters", summary="Learner hyper-parameters")
        async def learner_parameters(model: str = SCHEDULING_MODEL) -> Response:
            return await control(model, "parameters.get")

        @app.post("/learner/parameters", summary="Change learner hyper-parameters at run time")
        async def learner_set_parameters(request: Request, model: str = SCHEDULING_MODEL) -> Response:
            body = await bridge._read_body(request)
            return body if isinstance(body, Response) else await control(model, "parameters.set", body)

        @app.get("/learner/stats", summary="Learner statistics")
        async def learner_stats(model: str = SCHEDULING_MODEL) -> Response:
            return await control(model, "stats")

        @app.get("/learner/weights", summary="Current model weights (base64 torch payload + shape)")
        async def learner_weights(model: str = SCHEDULING_MODEL) -> Response:
            return await control(model, "weights.get")

        @app.get("/learner/reset", summary="Forget what the model learned")
        async def learner_reset(model: str = SCHEDULING_MODEL) -> Response:
            return await control(model, "reset")


class RequestMetrics:
    """Counts and times every request per route template, as a plain ASGI middleware
    (Starlette's ``@app.middleware("http")`` costs ~4x more per request: bench/README.md)."""

    def __init__(self, app, bridge: HttpBridge) -> None:
        self.app, self.bridge = app, bridge

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.bridge.http_requests.labels(route=path, status=str(status)).inc()
            self.bridge.http_latency.labels(route=path).observe(time.perf_counter() - start)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside our loop: the stack launcher owns SIGINT/SIGTERM, not uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield
