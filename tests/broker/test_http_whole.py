"""A direct call's HTTP response written whole (broker/http/edge.py's write_whole): on the real server it
replaces ASGI's two sends with one write, and says the same as the ASGI path (the answer's headers,
status, body, keep-alive, pipelining, ``Connection: close``); whatever it cannot pass on as it is goes
through ASGI."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from broker import headers as H
from broker.http import invoke as invoke_module
from broker.http_bridge import HttpBridge
from support import serving

pytestmark = pytest.mark.nats

READ_S = 10.0
# what differs from call to call, and what uvicorn adds to every response (the test transport has no server)
VARYING = {H.TIMING_TOTAL.lower(), H.TIMING_EXECUTION.lower(), H.TIMING_SCHEDULING.lower(), H.TIMING_QUEUEING.lower(),
           H.TIMING_TRANSIT.lower(), H.CALL_ID.lower(), "date", "server"}


@pytest.fixture
def whole(monkeypatch) -> list[bool]:
    """What each direct call's write_whole returned: True, written whole; False, sent through ASGI."""
    seen: list[bool] = []
    real = invoke_module.write_whole

    def spy(*args) -> bool:
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(invoke_module, "write_whole", spy)
    return seen


def comparable(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in VARYING}


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_S)
    status, *lines = head[:-4].split(b"\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), READ_S)
    return status, headers, body


async def test_a_direct_answer_is_written_whole_and_says_what_the_asgi_path_says(node_factory, nc, prefix, whole):
    async with node_factory(k=2) as node:
        bridge = HttpBridge(nc, node.settings.node_id, prefix=prefix, invoke_timeout_s=20)
        async with serving(bridge) as http, \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=bridge.app), base_url="http://asgi") as asgi:
            for path, body, status in (("/function/fib", b"20", 200), ("/function/nope", b"1", 404),
                                       ("/function/fib", b"x", 400)):
                fast = await http.post(path, content=body)
                slow = await asgi.post(path, content=body)
                assert fast.status_code == slow.status_code == status, (fast.text, slow.text)
                assert fast.content == slow.content
                assert comparable(fast) == comparable(slow), path
                assert fast.headers[H.CALL_ID] != slow.headers[H.CALL_ID]
                # ran (200, the function's 400): timed; refused (404): not
                assert (H.TIMING_TOTAL in fast.headers) == (status != 404) == (H.TIMING_TOTAL in slow.headers)
            assert fast.headers["content-type"] == "application/json"
            # the real server's cycle took every answer whole; the test transport's (no uvicorn) none
            assert whole == [True, False] * 3


async def test_keep_alive_pipelining_and_close_on_the_whole_path(node_factory, nc, prefix, whole):
    async with node_factory(k=2) as node:
        bridge = HttpBridge(nc, node.settings.node_id, prefix=prefix, invoke_timeout_s=20)
        async with serving(bridge) as http:
            port = httpx.URL(str(http.base_url)).port
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                request = b"POST /function/echo HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n%s"
                # two pipelined requests in one write: answered in order, on one connection
                writer.write(request % (3, b"", b"one") + request % (3, b"", b"two"))
                for expected in (b"one", b"two"):
                    status, headers, body = await read_response(reader)
                    assert status == b"HTTP/1.1 200 OK" and body == expected
                    assert b"connection" not in headers and headers[H.SCHEDULER.lower().encode()]
                # the caller asks to close: answered, said, and closed
                writer.write(request % (5, b"connection: close\r\n", b"three"))
                status, headers, body = await read_response(reader)
                assert body == b"three" and headers[b"connection"] == b"close"
                assert await asyncio.wait_for(reader.read(), READ_S) == b""
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
            assert whole == [True, True, True]


def test_only_header_lines_passed_on_as_they_are_skip_the_check_per_header() -> None:
    from broker.header_blocks import HeaderBlock, header_block
    from broker.http.invoke import _block_lines

    plain = b"X-P2pfaas-Status: 200\r\nX-P2pfaas-Scheduler: NoScheduler([true])\r\nRetry-After: 1\r\n"
    assert _block_lines(HeaderBlock(header_block(plain))) == plain
    for refused in (b"Nats-Msg-Id: 1\r\n",                # not the caller's: filtered by the ASGI path
                    b"X-A: a\nb\r\n", b"X-A: a\rb\r\n",   # a bare line end would split the response
                    b"X-A: \x00\r\n", "X-A: é\r\n".encode(),   # control or non-ASCII bytes: checked there
                    b"X A: 1\r\n"):                       # not a token
        assert _block_lines(HeaderBlock(header_block(refused))) is None, refused
    assert _block_lines({H.STATUS: "200"}) is None                              # no block: parsed headers
    assert _block_lines(HeaderBlock(b"NATS/1.0 503\r\n\r\n")) is None           # an inline status
