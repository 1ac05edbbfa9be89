"""The discovery service, the scheduler's :class:`~nodes.peer_source.PeerSource`: heartbeats out and
in, the alive-peer list (with the P2PFaaS machines of :mod:`nodes.discovery.machines`) and load probes."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

import httpx
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import headers as H
from broker.answers import VERSION
from broker.codec import decode, decode_update, encode
from broker.control import ControlError
from broker.errors import ContractError
from broker.messages import DiscoveryConfiguration, Heartbeat, MachineAnnouncement, NodeLoad, PeerInfo, PeerList
from broker.subjects import Subjects, group_token
from broker.lifecycle import cancel_and_wait, still_wanted
from nodes import peer_http
from nodes.config_store import read_node_file, write_node_file
from nodes.discovery.machines import MachinePoller, MachineTable, valid_ip
from nodes.discovery.membership import MembershipView
from nodes.settings import NodeSettings, host_of

log = logging.getLogger(__name__)
MAX_CLOCK_AHEAD_S = 60.0   # a peer's clock may be this far ahead of ours (NTP keeps them far closer)


class DiscoveryService:
    """Publishes this node's heartbeat every period and keeps the view of everyone else's.

    * heartbeats go to ``faas.membership.<group>.<node>``; a node hears only its own group's;
    * a newcomer is answered with an extra heartbeat at once (joining takes one round trip);
    * ``probe(peer)`` asks ``faas.<peer>.load`` within ``probe_timeout_s``; any failure is None,
      which schedulers read as a fully loaded peer, never as an idle one;
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
        self._heartbeats = None   # the subscription to this node's group
        self._task: asyncio.Task | None = None
        self._alive: list[str] = []   # last logged alive list (to log changes once)
        self.on_removed: list[Callable[[str], None]] = []   # told of each peer forgotten (the forwarder)
        self.machines = MachineTable(lambda: settings.machine_ip, self._is_nats_peer, settings.machine_dead_polls)
        self.poller = MachinePoller(self.machines, self.identity, port=settings.peer_discovery_port,
                                    period_s=settings.machine_poll_period_s, timeout_s=settings.machine_poll_timeout_s)
        self.http: httpx.AsyncClient | None = None   # probes and forwards to P2PFaaS machines
        self._load_configuration()

    # -- PeerSource ---------------------------------------------------------
    def peers(self) -> Sequence[str]:
        return [*self.view.alive(self._clock()), *(m.id for m in self.machines.schedulable())]

    def unreachable(self, peer: str, reason: str) -> None:
        machine = self.machines.by_id(peer)
        if machine is not None:
            self.machines.unreachable(machine.ip, reason)

    def http_base(self, peer: str) -> str | None:
        """The scheduler API of ``peer`` when it is a P2PFaaS machine (it speaks HTTP), else None."""
        machine = self.machines.by_id(peer)
        if machine is None:
            return None
        host = f"[{machine.ip}]" if ":" in machine.ip else machine.ip
        return f"http://{host}:{self.settings.peer_scheduler_port}"

    def resolve(self, name: str) -> str:
        """The peer id of a node named by its address (P2PFaaS names machines by IP), else ``name``."""
        ip = valid_ip(name)
        if ip is None:
            return name
        if ip == self.settings.machine_ip:
            return self.node_id
        for node in self.view.alive(self._clock()):
            hb = self.view.heartbeat(node)
            if hb is not None and host_of(hb.address) == ip:
                return node
        machine = self.machines.machines.get(ip)
        return machine.id if machine is not None else name

    def _is_nats_peer(self, ip: str) -> bool:
        now = self._clock()
        return any((hb := self.view.heartbeat(n)) is not None and host_of(hb.address) == ip for n in self.view.alive(now))

    async def probe(self, peer: str) -> int | None:
        base = self.http_base(peer)
        if base is not None:
            assert self.http is not None
            return await peer_http.probe(self.http, base, self.settings.probe_timeout_s)
        try:
            msg = await self.nc.request(self.subjects.load(peer), b"", timeout=self.settings.probe_timeout_s)
            load = decode(NodeLoad, msg.data)
        except Exception as exc:  # timeout, no responders, connection closed, malformed answer
            log.debug("probe of %s failed: %s", peer, exc)
            return None
        return load.running + load.queued

    def peer_list(self) -> PeerList:
        rows = [PeerInfo.model_validate(row) for row in self.view.as_p2pfaas_list(self._clock())]
        return PeerList([*rows, *(m.row() for m in self.machines.alive())])

    # -- P2PFaaS's discovery API (faas.<node>.discovery.*) ------------------------
    def identity(self) -> dict[str, str]:
        """The p2pfaas-machine-* headers this node announces itself with."""
        return {H.MACHINE_IP: self.settings.machine_ip, H.MACHINE_NAME: self.node_id, H.MACHINE_GROUP: self.settings.group}

    async def on_register(self, body: bytes) -> bytes:
        """A machine polled our list: it joins (or stays), and gets the list."""
        announced = decode(MachineAnnouncement, body)
        ip = valid_ip(announced.ip)
        if ip is None:
            raise ControlError(400, f"p2pfaas-machine-ip {announced.ip!r} is not an IP address")
        known = ip in self.machines.machines
        if self.machines.announce(ip, announced.name, announced.group_name) is not None and not known:
            log.info("%s: P2PFaaS machine %s joined", self.node_id, ip)
            self.poller.soon(ip)   # learn its peers now, not a poll period later
        return encode(self.peer_list())

    async def on_reset(self, body: bytes) -> bytes:
        """Forget every peer: machines for good, p2pfaas peers until their next heartbeat."""
        self.machines.reset()
        self.view = MembershipView(self.node_id, self.settings.heartbeat_period_s, self.settings.suspect_after,
                                   self.settings.remove_after)
        self._alive = []
        await self.beat()   # peers answer a newcomer with a heartbeat at once
        return b"{}"

    def configuration(self) -> DiscoveryConfiguration:
        return DiscoveryConfiguration(machine_ip=self.settings.machine_ip, machine_id=self.node_id,
                                      machine_group_name=self.settings.group, init_servers=self.settings.init_servers)

    async def on_config_get(self, body: bytes) -> bytes:
        return encode(self.configuration())

    async def on_config_set(self, body: bytes) -> bytes:
        """As P2PFaaS: keys sent replace, the others stay; changing the id or the address is refused."""
        current = self.configuration()
        new = decode_update(current, body)
        if (new.machine_id, new.machine_ip) != (current.machine_id, current.machine_ip):
            raise ControlError(400, f"machine_id and machine_ip are this node's own ({current.machine_id}, "
                                    f"{current.machine_ip!r}); start the node with another id or address to change them")
        bad = [s for s in new.init_servers if valid_ip(s) is None]
        if bad:
            raise ControlError(400, f"init_servers must be IP addresses, got {bad}")
        self._save_configuration(new)   # first: a write that fails (a full disk) changes nothing
        moved = group_token(new.machine_group_name) != group_token(self.settings.group)
        self.settings.group, self.settings.init_servers = new.machine_group_name, new.init_servers
        if moved and self._heartbeats is not None:   # another neighbourhood: hear its nodes, forget the old
            old, self._heartbeats = self._heartbeats, await self.nc.subscribe(
                self.subjects.all_membership(self.settings.group), cb=self._on_heartbeat)
            await old.unsubscribe()
            self.view = MembershipView(self.node_id, self.settings.heartbeat_period_s, self.settings.suspect_after,
                                       self.settings.remove_after)
            self._alive = []
        self._add_init_servers()
        await self.beat()
        return encode(self.configuration())

    def _add_init_servers(self) -> None:
        for server in self.settings.init_servers:
            ip = valid_ip(server)
            if ip is not None:
                self.machines.announce(ip)

    def _load_configuration(self) -> None:
        """The group and init servers set at run time (``discovery.json``) win over the settings'; an
        unreadable file is refused (NodeFileError), else the node would overwrite it."""
        saved = read_node_file(self.settings.node_dir / "discovery.json",
                               lambda data: decode(DiscoveryConfiguration, data),
                               "fix it, or delete it to start with the group and init servers of the settings")
        if saved is not None:
            self.settings.group, self.settings.init_servers = saved.machine_group_name, saved.init_servers

    def _save_configuration(self, configuration: DiscoveryConfiguration) -> None:
        path = self.settings.node_dir / "discovery.json"
        try:
            write_node_file(path, encode(configuration))
        except OSError as exc:
            raise ControlError(500, f"configuration not changed: {path} cannot be written "
                                    f"({exc.strerror or exc})") from None

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> "DiscoveryService":
        self._heartbeats = await self.nc.subscribe(self.subjects.all_membership(self.settings.group),
                                                   cb=self._on_heartbeat)
        self._subs.append(await self.nc.subscribe(self.subjects.peers(self.node_id), cb=self._on_peers))
        self.http = httpx.AsyncClient()
        self._add_init_servers()
        await self.poller.start()
        await self.beat()
        self._task = asyncio.create_task(self._run(), name=f"{self.node_id}-discovery")
        return self

    async def stop(self) -> None:
        await self.poller.stop()
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        await cancel_and_wait(self._task)
        self._task = None
        for sub in [*self._subs, *([self._heartbeats] if self._heartbeats else [])]:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone at shutdown
                log.debug("unsubscribe: %s", exc)
        self._subs.clear()
        self._heartbeats = None

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
            await self.nc.publish(self.subjects.membership(self.node_id, self.settings.group), encode(self.heartbeat()))
        except Exception as exc:  # broker blip: the next period tries again
            log.warning("heartbeat of %s not sent: %s", self.node_id, exc)

    async def _run(self) -> None:
        period = self.settings.heartbeat_period_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            still_wanted()
            next_at += period
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            await self.beat()
            now = self._clock()
            for node in self.view.sweep(now):
                log.info("%s: peer %s removed (silent for %d periods)", self.node_id, node, self.settings.remove_after)
                for listener in self.on_removed:
                    listener(node)
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
        now = self._clock()
        if msg.subject != self.subjects.membership(hb.node, hb.group) or hb.time > now + MAX_CLOCK_AHEAD_S:
            # someone else's subject, or dated in the future (it would outrank the peer's true ones)
            log.warning("%s: heartbeat of %r on %s refused (dated %+.0f s from now)", self.node_id, hb.node[:64],
                        msg.subject, hb.time - now)
            return
        known = hb.node in self._alive or self.view.heartbeat(hb.node) is not None
        if self.view.observe(hb, now) and not known:
            log.info("%s: peer %s joined", self.node_id, hb.node)
            self._alive = self.view.alive(now)
            await self.beat()  # let the newcomer learn about us now, not a period later

    async def _on_peers(self, msg: Msg) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, encode(self.peer_list()))
