"""The HTTP edge (broker/http/edge.py) on a real bridge, node and nats-server, from raw sockets:
head limits answered 431/414 as the bytes arrive, connection slots per client address and in all,
silent connections cut sooner under pressure, refusals counted and logged once per interval; and
issue 25's attack (bench/slow_clients.py) against a bridge process of its own.

Clients that must look like another machine bind their socket to another loopback address
(127.0.0.2, ...: the whole of 127/8 is loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect

from broker.http import edge as edge_module
from broker.http.limits import HttpLimits
from broker.http_bridge import HttpBridge
from support import eventually, serving, wait_until

ATTACKER = "127.0.0.2"
READ_S = 5.0   # every read of a refusal is bounded by this


@pytest.fixture(autouse=True, scope="module")
def _open_files() -> None:
    """Both ends of every connection are this process's files: a few hundred of them here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))


@contextlib.asynccontextmanager
async def edge_server(node_factory, nc, prefix, **limits):
    """(bridge, httpx client, port): a node with K=2 and its bridge on a free port, with these
    HttpLimits."""
    async with node_factory(k=2, queue=4):
        bridge = HttpBridge(nc, "n1", prefix=prefix, limits=HttpLimits(**limits))
        async with serving(bridge) as http:
            yield bridge, http, httpx.URL(str(http.base_url)).port


@pytest.fixture
async def edge(node_factory, nc, prefix):
    async with edge_server(node_factory, nc, prefix) as served:
        yield served


async def connect(port: int, source: str = "127.0.0.1"):
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), READ_S)


async def exchange(port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    """Send ``data`` on a new connection and read until the server closes it (bounded)."""
    reader, writer = await connect(port, source)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), READ_S)
    finally:
        writer.close()


async def refused_count(http: httpx.AsyncClient, reason: str) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith(f'p2pfaas_http_refused_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def echo_request(body: bytes, *extra: bytes) -> bytes:
    return (b"POST /function/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
            + b"".join(extra) + b"\r\n" + body)


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response[9:12])


async def test_a_head_over_its_limits_is_431_or_414_and_the_connection_closed(edge):
    _, http, port = edge
    limit = edge_module.HEAD_LIMIT
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * limit + b"\r\n\r\n"
    response = await exchange(port, big)                     # read to the end: the server closed
    assert status_of(response) == 431 and response.endswith(b"request line and headers over %d bytes" % limit)
    many = b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(edge_module.HEADER_COUNT_LIMIT + 1))
    response = await exchange(port, many + b"\r\n")
    assert status_of(response) == 431 and b"over 100 request headers" in response
    response = await exchange(port, b"GET /" + b"a" * limit + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(response) == 414
    assert status_of(await exchange(port, b"GET / HTTP/1.1\r\nHost x\r\n\r\n")) == 400   # not HTTP: still answered

    # within the limits: a head of exactly HEAD_LIMIT bytes with its body in the same write, a hundred
    # headers, and two requests pipelined in one write behind a large body
    start = b"POST /function/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\nX-Pad: "
    exact = start + b"p" * (limit - len(start) - 4) + b"\r\n\r\nhi"
    assert len(exact) - 2 == limit
    assert (response := await exchange(port, exact)).endswith(b"\r\n\r\nhi") and status_of(response) == 200
    hundred = echo_request(b"ok", b"Connection: close\r\n", *(b"X-H%d: v\r\n" % i for i in range(97)))
    assert status_of(await exchange(port, hundred)) == 200
    large = b"b" * 200_000
    both = echo_request(large) + echo_request(b"second", b"Connection: close\r\n")
    response = await exchange(port, both)
    assert response.count(b"HTTP/1.1 200 ") == 2 and large in response and response.endswith(b"second")
    assert await refused_count(http, "head_too_large") == 1 and await refused_count(http, "too_many_headers") == 1


async def test_a_head_is_counted_as_its_bytes_arrive(edge):
    """A head sent in small pieces is refused once HEAD_LIMIT bytes came, not when it ends (never)
    nor at the header deadline."""
    _, _, port = edge
    reader, writer = await connect(port)
    answer = asyncio.create_task(reader.read())
    sent, started = 0, time.monotonic()
    writer.write(b"GET /healthz HTTP/1.1\r\nX-Endless: ")
    with contextlib.suppress(ConnectionError):
        while not answer.done() and sent < 1024 * 1024:
            writer.write(b"a" * 512)
            await writer.drain()
            sent += 512
            await asyncio.sleep(0.001)
    response = await asyncio.wait_for(answer, READ_S)
    writer.close()
    assert status_of(response) == 431 and sent < 2 * edge_module.HEAD_LIMIT
    assert time.monotonic() - started < HttpLimits().header_timeout_s / 2


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_clients_sending_endless_headers_cost_the_server_no_memory(edge):
    """8 connections each try to send 100 MB of one header: each is cut after HEAD_LIMIT, and the
    process serving them (this one) does not grow."""
    _, http, port = edge
    chunk, per_connection = b"a" * 65536, 100 * 1024 * 1024

    async def endless() -> int:
        reader, writer = await connect(port, ATTACKER)
        sent = 0
        try:
            writer.write(b"POST /function/echo HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            while sent < per_connection:
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
        except ConnectionError:
            return sent
        finally:
            writer.close()
        return sent

    assert (await http.post("/function/echo", content=b"warm")).status_code == 200
    before, peak = rss_bytes(), 0
    senders = asyncio.gather(*(endless() for _ in range(8)))
    while not senders.done():
        peak = max(peak, rss_bytes())
        await asyncio.wait([senders], timeout=0.02)
    sent = await asyncio.wait_for(senders, 30)
    peak = max(peak, rss_bytes())
    assert all(n < 16 * 1024 * 1024 for n in sent), sent     # cut, with the kernel's buffers in between
    assert peak - before < 4 * 1024 * 1024, (before, peak)
    assert await eventually(lambda: refused_count(http, "head_too_large"), lambda n: n == 8)
    assert (await http.post("/function/echo", content=b"still")).content == b"still"


async def test_one_client_cannot_take_the_slots_of_the_others(edge):
    bridge, http, port = edge
    limit, extra = HttpLimits().client_connections, 44
    held = [await connect(port, ATTACKER) for _ in range(limit + extra)]
    try:
        reads = await asyncio.gather(*(asyncio.wait_for(reader.read(), 2.0) for reader, _ in held),
                                     return_exceptions=True)
        refused = [r for r in reads if isinstance(r, bytes)]
        assert len(refused) == extra and all(status_of(r) == 503 for r in refused)
        assert all(isinstance(r, asyncio.TimeoutError) for r in reads if not isinstance(r, bytes))
        t0 = time.monotonic()
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=5) as other:   # a new connection
            assert (await other.post("/function/echo", content=b"mine")).content == b"mine"
        assert time.monotonic() - t0 < 1.0
        assert bridge.http_edge.clients[ATTACKER] == limit
        assert await refused_count(http, "client_limit") == extra
    finally:
        for _, writer in held:
            writer.close()
    await wait_until(lambda: ATTACKER not in bridge.http_edge.clients, 5)
    assert status_of(await exchange(port, echo_request(b"back", b"Connection: close\r\n"), ATTACKER)) == 200


async def test_the_slots_of_all_clients_together_and_a_silent_connection_under_pressure(node_factory, nc, prefix):
    """The connection limit holds over every client; from PRESSURE_SHARE of it on, a new connection
    that sends nothing is cut after silent_timeout_s while those before it keep header_timeout_s."""
    async with edge_server(node_factory, nc, prefix, connections=12, client_connections=4,
                           silent_timeout_s=0.3) as (bridge, http, port):
        assert (await http.get("/monitoring/load")).status_code == 200   # httpx's connection: 1 of 12
        assert bridge.http_edge.pressure_at == 6
        early = [await connect(port, f"127.0.0.{3 + i // 4}") for i in range(5)]   # 6 open: no pressure yet
        late = [await connect(port, f"127.0.0.{5 + i // 4}") for i in range(7)]     # 7..12 open, then refused
        t0 = time.monotonic()
        reads = await asyncio.gather(*(asyncio.wait_for(r.read(), READ_S) for r, _ in late))
        assert time.monotonic() - t0 < 2.0
        assert [status_of(r) for r in reads if r] == [503]                          # the 13th: over the limit
        assert sum(r == b"" for r in reads) == 6                                    # cut silently
        assert await refused_count(http, "silent") == 6 and await refused_count(http, "total_limit") == 1
        assert all(not r.at_eof() for r, _ in early)
        assert bridge.http_edge.total == 6
        for _, writer in early + late:
            writer.close()
        await wait_until(lambda: bridge.http_edge.total == 1, 5)


async def test_a_websocket_keeps_its_slot_until_it_closes(node_factory, nc, prefix):
    async with edge_server(node_factory, nc, prefix, client_connections=3) as (bridge, http, port):
        url = f"ws://127.0.0.1:{port}/ui/live"
        assert (await http.get("/monitoring/load")).status_code == 200   # httpx's connection holds a slot
        for _ in range(4):   # more than the limit, one after the other
            async with ws_connect(url) as ws:
                assert (await asyncio.wait_for(ws.recv(), READ_S))
                assert bridge.http_edge.clients["127.0.0.1"] == 2   # httpx's connection and this one
            await wait_until(lambda: bridge.http_edge.clients["127.0.0.1"] == 1, 5)


async def test_refusals_are_counted_each_and_logged_once_per_interval(node_factory, nc, prefix, caplog):
    caplog.set_level(logging.WARNING, logger=edge_module.log.name)
    async with edge_server(node_factory, nc, prefix, client_connections=1) as (_, http, port):
        holder = await connect(port, ATTACKER)
        for _ in range(20):
            assert status_of(await exchange(port, b"", ATTACKER)) == 503
        holder[1].close()
        assert await refused_count(http, "client_limit") == 20
    lines = [r.getMessage() for r in caplog.records if r.name == edge_module.log.name]
    assert len(lines) == 1 and "client_limit" in lines[0] and ATTACKER in lines[0], lines


def test_a_bridge_process_raises_its_open_file_limit_when_low():
    """Each connection is an open file: started with 1024 (a common default), the edge raises its
    soft limit to what 2 x its connection limit need (at most the hard limit) and uses 3/4 of it."""
    code = ("import resource; soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard)); "
            "from broker.http.edge import Edge; edge = Edge(); "
            "print(hard, resource.getrlimit(resource.RLIMIT_NOFILE)[0], edge.limit)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    hard, soft, limit = (int(x) for x in done.stdout.split())
    connections = HttpLimits().connections
    wanted = 2 * connections
    assert soft == (wanted if hard in (resource.RLIM_INFINITY, -1) else min(wanted, hard))
    assert limit == min(connections, int(soft * edge_module.FILE_SHARE))


async def test_one_client_with_5000_slow_and_8_oversized_connections_leaves_the_others_served(nats_server, prefix,
                                                                                          tmp_path):
    """Issue 25's attack, by bench/slow_clients.py (its own server process: a node and its bridge, as
    ``up`` runs them; an attacker process on 127.0.0.2; sequential calls from 127.0.0.1, idle and
    under attack, interleaved twice). The bench's verdict holds p99 to 2x its idle value; a test on
    a shared 2-core machine (another process's load lands on the same cores) holds it to 3x + 50 ms:
    still far from what it guards against, calls that waited for 5 s."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "slow_clients.py"
    out = tmp_path / "slow.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(bench), "--quick", "--rounds", "2", "--nats-url", nats_server.url, "--prefix", prefix,
        "--json", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    printed, _ = await asyncio.wait_for(proc.communicate(), 90)
    assert out.exists(), printed.decode()[-3000:]
    run = json.loads(out.read_text())["runs"]["this"]
    for mode in ("keep_alive", "new_connection"):
        idle, attack = run["idle"][mode], run["attack"][mode]
        assert set(idle["statuses"]) == set(attack["statuses"]) == {"200"}, (mode, attack["statuses"])
        assert attack["p99_ms"] <= 3 * idle["p99_ms"] + 50, (mode, idle["p99_ms"], attack["p99_ms"])
    assert run["healthz_under_attack"] == [200, 200]
    assert run["rss_peak_mb"] - run["rss_idle_mb"] < 16, (run["rss_idle_mb"], run["rss_peak_mb"])
    edge = run["edge_under_attack"]
    assert edge['refused{reason="client_limit"}'] > 1000
    assert edge["p2pfaas_http_connections"] <= HttpLimits().client_connections + 2   # the attacker's, ours
    assert run["attacker"]["slow_attempts"] >= 2 * 5000
    assert run["server_open_files"] >= min(2 * HttpLimits().connections, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
