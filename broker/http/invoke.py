"""Invocation over HTTP: ``/function/{fn}`` (direct; the hot path, :class:`FastInvoke` in front of the
framework), ``/async-function/{fn}`` and ``/result/{id}``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Iterable

import httpx
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from broker import codes
from broker import headers as H
from broker.answers import VERSION, Answer, error_body
from broker.errors import BrokerUnavailable, FaasError, NodeUnavailable, NotPermitted, Unauthorized
from broker.header_blocks import NATS_HDR_LINE
from broker.http.bridge import Bridge
from broker.http.edge import write_whole
from broker.streams import RESULT_MAX_AGE_S
from broker.subjects import TOKEN_RE, check_token

log = logging.getLogger(__name__)

FUNCTION_PATH = "/function/"
# an async call's store without acknowledgement is tried again this long before 503 "not accepted"
SUBMIT_PATIENCE_S = 6.0
_CALLER = {name.lower().encode(): name for name in H.CALLER_HEADERS}
_OCTETS = (b"content-type", b"application/octet-stream")
_JSON = (b"content-type", b"application/json")
_OCTETS_LINE, _JSON_LINE = (b"%s: %s\r\n" % pair for pair in (_OCTETS, _JSON))
_CALL_ID = H.CALL_ID.encode()
_BLOCK_START = bytes(NATS_HDR_LINE) + b"\r\n"   # a header block's first line, without an inline status
# header lines an answer passes on to its HTTP caller untouched: a token name (X-..., or Retry-After), a printable value
_PASSED_ON = re.compile(rb"(?:(?:X-[!#$%&'*+.^_`|~0-9A-Za-z-]+|Retry-After):[ \t]*[\x20-\x7e\t]*\r\n)*")
# an async call's answer is POSTed to its X-Callback-Url if it comes while the results stream
# keeps it (as /result/{id} finds it), however long the call queued or ran: a direct call's
# limit (invoke_timeout_s) is no async call's
CALLBACK_WAIT_S = RESULT_MAX_AGE_S


def answer_header_list(answer: Answer, call_id: str) -> list[tuple[bytes, bytes]]:
    """The HTTP response headers of an answer: the node's P2PFaaS headers and the call id."""
    out = [_OCTETS if answer.status == 200 else _JSON, (H.CALL_ID.encode(), call_id.encode())]
    out.extend((k.encode(), v.encode("latin-1", "replace")) for k, v in answer.headers.items()
               if k.startswith("X-") or k == H.RETRY_AFTER)
    return out


def answer_response(answer: Answer, call_id: str) -> Response:
    response = Response(answer.body, status_code=answer.status)
    response.raw_headers = [*answer_header_list(answer, call_id), (b"content-length", str(len(answer.body)).encode())]
    return response


def error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"code": codes.for_status(status), "message": message}, status_code=status,
                        headers=headers or None)


async def faas_error(request: Request, exc: FaasError) -> JSONResponse:
    """Every app's handler of p2pfaas's errors: their HTTP status and ``{code, message}``."""
    headers = {H.RETRY_AFTER: "1"} if exc.http_status == 503 else {}
    if exc.http_status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return error(exc.http_status, str(exc), **headers)


def port_app(title: str, hello: str) -> FastAPI:
    """The app of another P2PFaaS port: ``GET /`` answers ``hello``; errors as on the main port."""
    app = FastAPI(title=title, version=VERSION)
    app.add_exception_handler(FaasError, faas_error)   # type: ignore[arg-type]

    @app.get("/", summary="Name and version (the same on every node)")
    async def greet() -> Response:
        return Response(hello, media_type="text/html")

    return app


async def direct_call(bridge: Bridge, fn: str, body: bytes, headers: dict[str, str]) -> tuple[Answer, str]:
    """One direct call through the node; errors of the path itself become answers too."""
    call_id = bridge.new_call_id()
    asked = headers.get(H.TIMEOUT)
    if asked is not None:   # a function timeout the bridge would not wait for: said now, not as a 504 later
        try:
            too_long = float(asked) > bridge.invoke_timeout_s
        except ValueError:
            too_long = False   # not a number: the node answers 400 with its reason
        if too_long:
            return Answer(400, error_body(codes.INPUT_NOT_VALID, (
                f"{H.TIMEOUT} {asked} exceeds the {bridge.invoke_timeout_s:g} s this bridge waits for a direct "
                f"call: ask for less, or call /async-function/{fn} (its result is kept)"))), call_id
    try:
        answer = await bridge.faas.invoke(bridge.node, fn, body, req=call_id, headers=headers,
                                          timeout_s=bridge.invoke_timeout_s)
    except asyncio.TimeoutError:
        answer = Answer(504, error_body(codes.GENERIC, f"no answer from node {bridge.node} within {bridge.invoke_timeout_s:g} s"))
    except NodeUnavailable as exc:
        answer = Answer(503, error_body(codes.GENERIC, str(exc)), {H.RETRY_AFTER: "1"})
    except NotPermitted as exc:   # the deployment's permissions are wrong: say so, do not hang
        answer = Answer(500, error_body(codes.GENERIC, str(exc)))
    return answer, call_id


class FastInvoke:
    """ASGI: ``GET|POST /function/{fn}`` without the framework; everything else to ``app``."""

    def __init__(self, app, bridge: Bridge) -> None:
        self.app, self.bridge = app, bridge

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(FUNCTION_PATH) or scope["method"] not in ("GET", "POST"):
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = await self._invoke(scope, receive, send)
        self.bridge.count("/function/{fn}", status, time.perf_counter() - started)

    async def _invoke(self, scope, receive, send) -> int:
        bridge = self.bridge
        fn = scope["path"][len(FUNCTION_PATH):]
        if not TOKEN_RE.match(fn):
            return await _send(send, 400, error_body(codes.INPUT_NOT_VALID, f"invalid function {fn[:64]!r}: must match [A-Za-z0-9_-]{{1,64}}"), [_JSON])
        headers, declared, authorization = _caller_headers(scope["headers"])
        if not bridge.may_invoke(authorization):
            return await _send(send, 401, error_body(401, "invocation needs the invoke token (Authorization: Bearer ...)"),
                               [_JSON, (b"www-authenticate", b"Bearer")])
        if declared is not None and declared > bridge.max_payload_bytes:
            return await _send(send, 413, error_body(codes.INPUT_NOT_VALID, f"payload of {declared} bytes exceeds the limit of {bridge.max_payload_bytes}"), [_JSON])
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return 499
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > bridge.max_payload_bytes:
                return await _send(send, 413, error_body(codes.INPUT_NOT_VALID, f"payload exceeds the limit of {bridge.max_payload_bytes} bytes"), [_JSON])
        answer, call_id = await direct_call(bridge, fn, body, headers)
        lines = _block_lines(answer.headers)
        if lines is not None:
            head = b"%s%s: %s\r\n%s" % (_OCTETS_LINE if answer.status == 200 else _JSON_LINE, _CALL_ID, call_id.encode(), lines)
            if write_whole(send, answer.status, head, answer.body):
                return answer.status
        return await _send(send, answer.status, answer.body, answer_header_list(answer, call_id))


def _block_lines(headers: object) -> bytes | None:
    """An answer's header lines as they travelled, when all of them go to the HTTP caller as they are
    (P2PFaaS's X- headers and Retry-After, printable ASCII): the response needs no parse, nor a check per
    header. None otherwise (an inline status, another header, a byte to check): answer_header_list."""
    block = getattr(headers, "block", None)
    if block is None or not block.startswith(_BLOCK_START) or not block.endswith(b"\r\n\r\n"):
        return None
    lines = block[len(_BLOCK_START):-2]
    return lines if _PASSED_ON.fullmatch(lines) else None


def _caller_headers(raw: Iterable[tuple[bytes, bytes]]) -> tuple[dict[str, str], int | None, str | None]:
    """The P2PFaaS request headers a caller may set, the declared body length, the Authorization."""
    headers: dict[str, str] = {}
    declared = authorization = None
    for name, value in raw:
        if name == b"content-length":
            declared = int(value) if value.isdigit() else None
        elif name in _CALLER:
            headers[_CALLER[name]] = value.decode("latin-1")
        elif name == b"authorization":
            authorization = value.decode("latin-1")
    return headers, declared, authorization


async def _send(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
    return status


async def call_state(bridge: Bridge, call_id: str) -> tuple[Answer | None, bool]:
    """Async call ``call_id``'s stored answer, and whether its task is still stored, read from JetStream
    (every bridge process answers the same). The node stores the answer before it removes the task, so
    when neither is found the answer is asked again: a call that exists is never "unknown"."""
    faas, client = bridge.faas, bridge.client_id
    found = await asyncio.gather(faas.stored_answer(client, call_id), faas.stored_call(client, call_id),
                                 return_exceptions=True)   # both end before a failure is raised
    for outcome in found:
        if isinstance(outcome, BaseException):
            raise outcome
    answer, waiting = found
    if answer is None and not waiting:
        answer = await faas.stored_answer(client, call_id)
    return answer, waiting


async def deliver_callback(bridge: Bridge, fut: "asyncio.Future[Answer]", call_id: str, url: str) -> None:
    """POST the answer of async call ``call_id`` to ``url`` when it comes."""
    loop, limits = asyncio.get_running_loop(), bridge.limits
    deadline = loop.time() + CALLBACK_WAIT_S
    try:
        answer = None
        while answer is None:
            try:
                async with asyncio.timeout(min(limits.callback_look_s, deadline - loop.time())):
                    answer = await asyncio.shield(fut)
            except FaasError as exc:   # an answer that is no Answer: said, not a task dying silently
                log.warning("async call %s: its answer cannot be read (%s): no callback", call_id, exc)
                return
            except asyncio.TimeoutError:
                with contextlib.suppress(FaasError):   # JetStream away for now: the next look
                    answer = await bridge.faas.stored_answer(bridge.client_id, call_id)
                if answer is None and loop.time() >= deadline:
                    log.warning("async call %s got no answer within %.0f s: no callback", call_id, CALLBACK_WAIT_S)
                    return
    finally:
        bridge.faas.forget(call_id)
    response = answer_response(answer, call_id)
    try:
        async with httpx.AsyncClient(timeout=limits.callback_post_s) as client:
            # httpx's timeout is per read: a target trickling its response would hold this for ever
            async with asyncio.timeout(limits.callback_post_s):
                await client.post(url, content=response.body, headers=dict(response.headers.items()))
    except Exception as exc:   # whatever goes wrong, said (the background task must not die silently)
        log.warning("callback %s for %s failed: %r", url, call_id, exc)


def invoke_router(bridge: Bridge) -> APIRouter:
    router = APIRouter(tags=["invoke"])

    async def may_invoke(request: Request) -> None:
        if not bridge.may_invoke(request.headers.get("authorization")):
            raise Unauthorized("invocation needs the invoke token (Authorization: Bearer ...)")

    router.dependencies.append(Depends(may_invoke))

    @router.get("/function/{fn}", summary="Invoke a function synchronously (direct path)", operation_id="invoke_get")
    @router.post("/function/{fn}", summary="Invoke a function synchronously (direct path)", operation_id="invoke_post")
    async def invoke(fn: str, request: Request) -> Response:
        check_token(fn, "function")
        body = await bridge.read_body(request)
        answer, call_id = await direct_call(bridge, fn, body, _caller_headers(request.headers.raw)[0])
        return answer_response(answer, call_id)

    @router.post("/async-function/{fn}", status_code=202, summary="Invoke asynchronously (durable); 202 + X-Call-Id")
    async def invoke_async(fn: str, request: Request) -> Response:
        check_token(fn, "function")
        callback = request.headers.get(H.CALLBACK_URL)
        bridge.check_callback(callback)
        body = await bridge.read_body(request)
        call_id = bridge.new_call_id()
        fut = bridge.faas.expect(call_id) if callback else None   # without one, nothing waits here
        try:
            await bridge.faas.submit(bridge.node, fn, body, call_id, _caller_headers(request.headers.raw)[0],
                                     retry_for_s=SUBMIT_PATIENCE_S)
        except Exception as exc:  # not stored: the caller must know it was not accepted
            bridge.faas.forget(call_id)
            return error(503, f"call not accepted (not stored): {exc}", **{H.RETRY_AFTER: "1"})
        if fut is not None and callback:
            bridge.background(deliver_callback(bridge, fut, call_id, callback))
        return JSONResponse({"call_id": call_id, "status": "accepted", "result_url": f"/result/{call_id}",
                             "result_topic": bridge.subjects.result(bridge.client_id, call_id)},
                            status_code=202, headers={H.CALL_ID: call_id})

    @router.get("/result/{call_id}", summary="Fetch the result of an async call")
    async def result(call_id: str) -> Response:
        check_token(call_id, "call id")
        try:
            async with asyncio.timeout(bridge.control_timeout_s):
                answer, waiting = await call_state(bridge, call_id)
        except asyncio.TimeoutError:
            log.warning("GET /result/%s: JetStream did not answer within %g s: 503 (is nats-server overloaded?)",
                        call_id, bridge.control_timeout_s)
            raise BrokerUnavailable(f"the state of call {call_id} cannot be read now (JetStream did not answer "
                                    f"within {bridge.control_timeout_s:g} s); try again") from None
        if answer is not None:
            return answer_response(answer, call_id)
        if waiting:
            return JSONResponse({"call_id": call_id, "status": "pending"}, status_code=202,
                                headers={H.CALL_ID: call_id, H.RETRY_AFTER: "1"})
        return error(404, f"no result for call {call_id} (unknown, or older than the result retention)")

    return router

