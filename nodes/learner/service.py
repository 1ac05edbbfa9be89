"""The learner service: one :class:`~nodes.learner.node_learner.NodeLearner` per node it learns
for (a node's own, or a learner shared by several nodes; docs/learner.md)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from broker.streams import ensure_node_streams
from broker.subjects import Subjects
from nodes.learner.node_learner import DURABLE, STATUS_HEADER, NodeLearner
from nodes.learner.settings import LearnerSettings

__all__ = ["LearnerService", "LearnerSettings", "NodeLearner", "run_learner", "STATUS_HEADER", "DURABLE"]


class LearnerService:
    """The learner of one or several nodes (a shared learner): one `NodeLearner` each."""

    def __init__(self, nc: Client, settings: LearnerSettings | None = None) -> None:
        self.nc = nc
        self.settings = settings or LearnerSettings()
        self.subjects = Subjects(self.settings.prefix)
        self.learners = {node: NodeLearner(nc, self.settings, node) for node in self.settings.node_ids}

    def __getitem__(self, node: str) -> NodeLearner:
        return self.learners[node]

    async def start(self) -> "LearnerService":
        # torch's first optimizer imports its compiler stack (~2-3 s): now, off the event loop
        await asyncio.to_thread(_warm_up_torch)
        js = self.nc.jetstream()
        try:
            for node, learner in self.learners.items():
                await ensure_node_streams(js, self.subjects, node)
                await learner.start()
        except BaseException:
            await self.stop()  # leave no subscription or task behind
            raise
        await self.nc.flush()  # subscriptions are live at the server when start() returns
        return self

    async def stop(self) -> None:
        await asyncio.gather(*(learner.stop() for learner in self.learners.values()))

    async def __aenter__(self) -> "LearnerService":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _warm_up_torch() -> None:
    import torch

    torch.optim.Adam([torch.zeros(1, requires_grad=True)])


async def run_learner(settings: LearnerSettings, stop: asyncio.Event) -> None:
    """Connect, serve until ``stop`` is set, checkpoint and disconnect (the CLI's body)."""
    from broker.connection import close_quietly, connect

    nc = await connect(settings.nats_url, f"learner-{'-'.join(settings.node_ids)}"[:64])
    try:
        async with LearnerService(nc, settings):
            await stop.wait()
    finally:
        await close_quietly(nc)
