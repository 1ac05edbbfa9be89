"""Shared fixtures: a real nats-server (JetStream + MQTT listener) and a real mosquitto
per test session, on free ports; every test gets its own subject prefix."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import threading
import uuid
from pathlib import Path
from typing import AsyncIterator, Callable

import pytest

from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import Mosquitto, NatsServer
from broker.streams import stream_names
from broker.subjects import Subjects
from broker.messages import NodeConfiguration, SchedulerConfiguration
from nodes.node import Node
from nodes.settings import NodeSettings


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "nats_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.nats)
        if "mosquitto" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.mosquitto)


# -- a test that hangs says where -------------------------------------------------------------
# pytest-timeout (120 s, pyproject.toml) shows the threads' stacks: here the main thread only waits
# in its event loop. Before that, the loop's own tasks are printed (captured with the test's output).
HANG_DUMP_S = 90.0
_loops: list[asyncio.AbstractEventLoop] = []


@pytest.fixture(scope="session", autouse=True)
async def _session_loop() -> AsyncIterator[None]:
    _loops.append(asyncio.get_running_loop())
    yield


def _dump_tasks(nodeid: str) -> None:
    tasks = asyncio.all_tasks()
    print(f"--- {nodeid} has run {HANG_DUMP_S:g} s; its event loop's {len(tasks)} tasks:", file=sys.stderr)
    for task in tasks:
        task.print_stack(limit=15, file=sys.stderr)


def _hanging(nodeid: str) -> None:
    for loop in _loops:
        if not loop.is_closed():
            loop.call_soon_threadsafe(_dump_tasks, nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timer = threading.Timer(HANG_DUMP_S, _hanging, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@pytest.fixture(scope="session")
async def nats_server(tmp_path_factory) -> AsyncIterator[NatsServer]:
    server = NatsServer(data_dir=tmp_path_factory.mktemp("nats"), port=None, mqtt_port=0)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture(scope="session")
async def mosquitto(tmp_path_factory) -> AsyncIterator[Mosquitto]:
    if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists():
        pytest.fail("mosquitto is not installed: apt-get install -y mosquitto mosquitto-clients (.ci/run does this)")
    broker = Mosquitto(data_dir=tmp_path_factory.mktemp("mosquitto"), port=None)
    await broker.start()
    yield broker
    await broker.stop()


@pytest.fixture
async def prefix(nats_server) -> AsyncIterator[str]:
    """A subject prefix of this test alone: its own streams, subjects and topics (the streams are
    deleted afterwards: JetStream reserves their byte limits on the server)."""
    name = "t" + uuid.uuid4().hex[:10]
    yield name
    conn = await connect(nats_server.url, "cleanup")
    try:
        js = conn.jetstream()
        for stream in await js.streams_info():
            if stream.config.name.startswith(stream_names(Subjects(name))):
                await js.delete_stream(stream.config.name)
    finally:
        await close_quietly(conn)


@pytest.fixture
async def nc(nats_server):
    conn = await connect(nats_server.url, "test")
    yield conn
    await close_quietly(conn)


@pytest.fixture
async def faas(nc, prefix) -> AsyncIterator[FaasClient]:
    async with FaasClient(nc, client="dev1", prefix=prefix) as client:
        yield client


NodeFactory = Callable[..., "contextlib.AbstractAsyncContextManager[Node]"]


@pytest.fixture
def node_factory(nats_server, prefix, tmp_path) -> NodeFactory:
    """``async with node_factory(k=2, queue=4, **settings) as node`` — a real node, workers ready."""

    @contextlib.asynccontextmanager
    async def make(node_id: str = "n1", k: int = 2, queue: int = 4, queue_enabled: bool = True,
                   scheduler: tuple[str, list[str]] = ("NoScheduler", ["true"]), data_dir: Path | None = None,
                   **overrides) -> AsyncIterator[Node]:
        settings = NodeSettings(
            node_id=node_id, nats_url=nats_server.url, prefix=prefix, data_dir=data_dir or tmp_path,
            initial=NodeConfiguration(parallel_running_functions_max=k, queue_length_max=queue,
                                      queue_enabled=queue_enabled),
            initial_scheduler=SchedulerConfiguration(name=scheduler[0], parameters=scheduler[1]),
            **{"learner": False, **overrides},  # torch's start-up cost only where a test asks for it
        )
        node = Node(settings)
        await node.start()
        try:
            assert node.pool is not None
            await node.pool.wait_ready(30)
            yield node
        finally:
            await node.stop()

    return make
