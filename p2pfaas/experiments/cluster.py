"""The harness both experiments share: nodes started in this process on one NATS,
a client, run-time scheduler configuration, and a timed open-loop load driver."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Callable

import orjson

from broker import headers as H
from broker.client import Answer, FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer
from broker.messages import SchedulerConfiguration
from broker.subjects import Subjects
from nodes.node import Node
from nodes.settings import NodeSettings

Progress = Callable[[str, int, int], None]   # (label, answered, total)


@dataclass(frozen=True, slots=True)
class Send:
    """One request of an open-loop run: sent ``at`` seconds after the start to ``node``."""

    at: float
    node: str
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def experiment_broker(nats_url: str | None, data_dir: Path | None) -> AsyncIterator[tuple[str, Path]]:
    """(NATS URL, data directory) of a run: a private nats-server and a temporary one unless given."""
    with contextlib.ExitStack() as tmp:
        if data_dir is None:
            data_dir = Path(tmp.enter_context(tempfile.TemporaryDirectory(prefix="p2pfaas-eval-")))
        if nats_url is not None:
            yield nats_url, data_dir
            return
        async with NatsServer(data_dir=data_dir / "nats", port=None) as server:
            yield server.url, data_dir


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:g} s")
        await asyncio.sleep(0.05)


class ExperimentCluster:
    """``async with ExperimentCluster(settings, nats_url, prefix, client)``: the nodes are up,
    workers ready and every node sees every other."""

    def __init__(self, settings: list[NodeSettings], nats_url: str, prefix: str, client: str) -> None:
        self.settings, self.nats_url, self.prefix, self.client = settings, nats_url, prefix, client
        self.subjects = Subjects(prefix)
        self.ids = [s.node_id for s in settings]
        self.nodes: list[Node] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> "ExperimentCluster":
        try:
            for settings in self.settings:
                self.nodes.append(await self._stack.enter_async_context(Node(settings)))
            for node in self.nodes:
                assert node.pool is not None
                await node.pool.wait_ready(60)
            await until(lambda: all(len(n.discovery.peers()) == len(self.ids) - 1 for n in self.nodes), 30,
                        "the nodes did not discover each other")
            self.nc = await connect(self.nats_url, f"eval-{self.client}")
            self._stack.push_async_callback(close_quietly, self.nc)
            self.faas = await self._stack.enter_async_context(FaasClient(self.nc, client=self.client, prefix=self.prefix))
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def configure(self, per_node: dict[str, tuple[str, list[str]]]) -> str:
        """Set each node's algorithm over its configuration subject; the first node's printed name."""
        for node_id, (name, params) in per_node.items():
            body = orjson.dumps(SchedulerConfiguration(name=name, parameters=params).model_dump())
            reply = await self.nc.request(self.subjects.scheduler_config(node_id, "set"), body, timeout=5)
            if reply.headers and reply.headers.get(H.STATUS, "200") != "200":
                raise ValueError(f"{name}{params}: {reply.data.decode()}")
        return self.nodes[0].scheduler.algorithm.describe()

    async def drive(self, sends: list[Send], tag: str, label: str, progress: Progress | None,
                    fn: str = "sleep", timeout_s: float = 60.0) -> list[tuple[Answer | None, float]]:
        """Wait until idle, then send each request at its time; (answer or None, client latency) each."""
        await until(lambda: all(n.scheduler.main.n_running + n.scheduler.main.n_queued == 0 for n in self.nodes),
                    120, "nodes did not become idle")
        answered = 0

        async def one(i: int, s: Send) -> tuple[Answer | None, float]:
            nonlocal answered
            started = time.perf_counter()
            try:
                answer = await self.faas.invoke(s.node, fn, s.payload, req=f"{tag}x{i}", headers=s.headers,
                                                timeout_s=timeout_s)
            except Exception:  # no answer in time, or not accepted by the broker: counted as an error
                answer = None
            answered += 1
            if progress:
                progress(label, answered, len(sends))
            return answer, time.perf_counter() - started

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tasks = []
        for i, s in enumerate(sends):
            delay = t0 + s.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, s)))
        return list(await asyncio.gather(*tasks))
