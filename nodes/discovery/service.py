"""The discovery service: heartbeats out, heartbeats in, the alive-peer list and load probes.

It is the scheduler's :class:`~nodes.scheduler.service.PeerSource`: ``peers()``
comes from the :class:`MembershipView`, ``probe(peer)`` asks ``faas.<peer>.load``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.codec import decode, encode
from broker.errors import ContractError
from broker.messages import Heartbeat, NodeLoad, PeerInfo, PeerList
from broker.subjects import Subjects
from nodes.discovery.membership import MembershipView
from nodes.settings import NodeSettings

log = logging.getLogger(__name__)

VERSION = "0.1.0"


class DiscoveryService:
    """Publishes this node's heartbeat every period and keeps the view of everyone else's.

    * heartbeats go to ``faas.membership.<node>``; with several nats-servers
      (cluster or leaf nodes) the subject simply propagates, so no peer
      addresses are configured: ``NodeSettings.seeds`` only lists more servers
      to connect to;
    * a newcomer is answered with an extra heartbeat at once, so joining takes
      one round trip rather than one period;
    * ``probe(peer)`` is a request/reply on ``faas.<peer>.load`` bounded by
      ``probe_timeout_s``; any failure is None, which schedulers read as a
      fully loaded peer, never as an idle one;
    * ``faas.<node>.peers`` answers the alive list in P2PFaaS ``GET /list`` format.
    """

    def __init__(self, settings: NodeSettings, nc: Client, load: Callable[[], NodeLoad],
                 clock: Callable[[], float] = time.time,
                 activity: Callable[[], tuple[str, dict[str, int]]] = lambda: ("", {})) -> None:
        """``activity``: the node's algorithm and its forwards per peer since the last call."""
        self.settings = settings
        self.node_id = settings.node_id
        self.nc = nc
        self.subjects = Subjects(settings.prefix)
        self.view = MembershipView(settings.node_id, settings.heartbeat_period_s,
                                   settings.suspect_after, settings.remove_after)
        self._load = load
        self._activity = activity
        self._clock = clock
        self._subs: list = []
        self._task: asyncio.Task | None = None
        self._alive: list[str] = []   # last logged alive list (to log changes once)

    # -- PeerSource ---------------------------------------------------------
    def peers(self) -> Sequence[str]:
        return self.view.alive(self._clock())

    async def probe(self, peer: str) -> int | None:
        try:
            msg = await self.nc.request(self.subjects.load(peer), b"", timeout=self.settings.probe_timeout_s)
            load = decode(NodeLoad, msg.data)
        except Exception as exc:  # timeout, no responders, connection closed, malformed answer
            log.debug("probe of %s failed: %s", peer, exc)
            return None
        return load.running + load.queued

    def peer_list(self) -> PeerList:
        return PeerList([PeerInfo.model_validate(row) for row in self.view.as_p2pfaas_list(self._clock())])

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> "DiscoveryService":
        self._subs.append(await self.nc.subscribe(self.subjects.all_membership(), cb=self._on_heartbeat))
        self._subs.append(await self.nc.subscribe(self.subjects.peers(self.node_id), cb=self._on_peers))
        await self.beat()
        self._task = asyncio.create_task(self._run(), name=f"{self.node_id}-discovery")
        return self

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone at shutdown
                log.debug("unsubscribe: %s", exc)
        self._subs.clear()

    async def __aenter__(self) -> "DiscoveryService":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- heartbeats -------------------------------------------------------------
    def heartbeat(self) -> Heartbeat:
        load = self._load()
        scheduler, forwards = self._activity()
        return Heartbeat(node=self.node_id, address=self.settings.address, group=self.settings.group,
                         running=load.running, queued=load.queued,
                         parallel_running_functions_max=load.parallel_running_functions_max,
                         queue_length_max=load.queue_length_max, version=VERSION, time=self._clock(),
                         scheduler=scheduler, forwards=forwards)

    async def beat(self) -> None:
        try:
            await self.nc.publish(self.subjects.membership(self.node_id), encode(self.heartbeat()))
        except Exception as exc:  # broker blip: the next period tries again
            log.warning("heartbeat of %s not sent: %s", self.node_id, exc)

    async def _run(self) -> None:
        period = self.settings.heartbeat_period_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += period
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            await self.beat()
            now = self._clock()
            for node in self.view.sweep(now):
                log.info("%s: peer %s removed (silent for %d periods)", self.node_id, node, self.settings.remove_after)
            self._log_changes(now)

    def _log_changes(self, now: float) -> None:
        alive = self.view.alive(now)
        if alive != self._alive:
            gone = sorted(set(self._alive) - set(alive))
            if gone:
                log.info("%s: peers %s no longer alive (suspected or removed)", self.node_id, ", ".join(gone))
            self._alive = alive

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            hb = decode(Heartbeat, msg.data)
        except ContractError as exc:
            log.warning("bad heartbeat on %s: %s", msg.subject, exc)
            return
        if hb.node == self.node_id:
            return
        known = hb.node in self._alive or self.view.heartbeat(hb.node) is not None
        now = self._clock()
        if self.view.observe(hb, now) and not known:
            log.info("%s: peer %s joined", self.node_id, hb.node)
            self._alive = self.view.alive(now)
            await self.beat()  # let the newcomer learn about us now, not a period later

    async def _on_peers(self, msg: Msg) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, encode(self.peer_list()))
