"""Machines that speak P2PFaaS's HTTP discovery protocol, beside the NATS peers: a mixed cluster
(docs/compat.md). As P2PFaaS's watcher, we poll each alive machine's ``GET /list`` and merge it;
``dead_polls`` failed polls in a row take a machine off. Unlike P2PFaaS, only a machine itself (not
another's list) revives it once declared dead, so stale gossip cannot bring a dead peer back."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import httpx

from broker import headers as H
from broker.lifecycle import still_wanted
from broker.messages import PeerInfo
from broker.subjects import machine_token

log = logging.getLogger(__name__)

def valid_ip(text: str) -> str | None:
    """``text`` as a canonical IP address (a ``host:port`` loses its port), None if it is none. An IPv6
    scope id (it would end up in the URL we poll) and unreachable addresses (unspecified, multicast,
    reserved: we would poll them for ever) are refused."""
    host = text.strip()
    if host.count(":") == 1:     # IPv4 with a port, as P2PFaaS's IsolateIPFromPort reads it
        host = host.split(":")[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if (getattr(address, "scope_id", None) or address.is_unspecified or address.is_multicast
            or (address.version == 4 and address.is_reserved)):   # IPv6's "reserved" ::/8 holds ::1
        return None
    return str(address)


@dataclass(slots=True)
class Machine:
    ip: str
    name: str
    group_name: str
    first_seen: int
    ping: float = 0.0
    last_update: float = 0.0
    alive: bool = True
    dead_polls: int = 0
    unreachable: bool = False   # a forward to it failed in transit: not scheduled until it shows up again

    @property
    def id(self) -> str:
        return machine_token(self.ip)

    def row(self) -> PeerInfo:
        return PeerInfo(id=self.first_seen, ip=self.ip, name=self.name or self.id, group_name=self.group_name,
                        ping=self.ping, last_update=int(self.last_update), alive=self.alive,
                        dead_polls=self.dead_polls, address=self.ip, protocol="http")


class MachineTable:
    """P2PFaaS discovery's table of machines, without I/O (the poller below does the HTTP)."""

    def __init__(self, own_ip: Callable[[], str], is_nats_peer: Callable[[str], bool],
                 dead_polls: int = 20, clock: Callable[[], float] = time.time) -> None:
        self._own_ip, self._is_nats_peer = own_ip, is_nats_peer
        self.dead_polls, self.clock = dead_polls, clock
        self.machines: dict[str, Machine] = {}
        self._sightings = 0

    def _acceptable(self, ip: str) -> bool:
        return ip != self._own_ip() and not self._is_nats_peer(ip)

    def announce(self, ip: str, name: str = "", group_name: str = "") -> Machine | None:
        """The machine itself said it is there (or an operator named it): alive, whatever it was."""
        if not self._acceptable(ip):
            return None
        machine = self.machines.get(ip)
        if machine is None:
            self._sightings += 1
            machine = self.machines[ip] = Machine(ip, name, group_name, self._sightings)
        machine.name, machine.group_name = name or machine.name, group_name or machine.group_name
        machine.alive, machine.dead_polls, machine.last_update = True, 0, self.clock()
        machine.unreachable = False
        return machine

    def merge(self, rows: Iterable[dict]) -> None:
        """Machines another machine lists: new ones join; a known dead one stays dead."""
        for row in rows:
            ip = valid_ip(str(row.get("ip", ""))) if isinstance(row, dict) else None
            if ip is not None and ip not in self.machines and self._acceptable(ip):
                self.announce(ip, str(row.get("name", "")), str(row.get("group_name", "")))

    def polled(self, ip: str, ping_s: float | None) -> None:
        """A poll of ``ip`` succeeded (``ping_s``) or failed (None)."""
        machine = self.machines.get(ip)
        if machine is None:
            return
        machine.last_update = self.clock()
        if ping_s is not None:
            machine.ping, machine.alive, machine.dead_polls, machine.unreachable = ping_s, True, 0, False
            return
        machine.dead_polls += 1
        if machine.dead_polls >= self.dead_polls and machine.alive:
            machine.alive = False
            log.info("machine %s declared dead after %d failed polls", ip, machine.dead_polls)

    def unreachable(self, ip: str, reason: str) -> None:
        """A forward to ``ip`` failed in transit: the schedulers stop choosing it until it answers a
        poll or announces itself; it stays listed and polled (only polls declare it dead)."""
        machine = self.machines.get(ip)
        if machine is not None and not machine.unreachable:
            machine.unreachable = True
            log.warning("machine %s not scheduled until it answers a poll or announces itself: %s", ip, reason)

    def alive(self) -> list[Machine]:
        return sorted((m for m in self.machines.values() if m.alive and self._acceptable(m.ip)), key=lambda m: m.ip)

    def schedulable(self) -> list[Machine]:
        """The alive machines the schedulers may choose: not those a forward just failed to reach."""
        return [m for m in self.alive() if not m.unreachable]

    def by_id(self, peer: str) -> Machine | None:
        return next((m for m in self.machines.values() if m.id == peer and m.alive), None)

    def reset(self) -> None:
        self.machines.clear()


class MachinePoller:
    """Polls every alive machine's ``GET /list`` each period, announcing this node as P2PFaaS does."""

    def __init__(self, table: MachineTable, identity: Callable[[], dict[str, str]], *, port: int,
                 period_s: float, timeout_s: float) -> None:
        self.table, self.identity, self.port = table, identity, port
        self.period_s, self.timeout_s = period_s, timeout_s
        self._task: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None
        self._once: set[asyncio.Task] = set()

    async def start(self) -> "MachinePoller":
        self._http = httpx.AsyncClient(timeout=self.timeout_s)
        self._task = asyncio.create_task(self._run(), name="machine-poller")
        return self

    async def stop(self) -> None:
        for task in [*self._once, *([self._task] if self._task else [])]:
            task.cancel()
        await asyncio.gather(*self._once, *([self._task] if self._task else []), return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    def soon(self, ip: str) -> None:
        """Poll one machine now (it just joined), in the background."""
        if self._http is None:
            return
        task = asyncio.get_running_loop().create_task(self.poll(ip))
        self._once.add(task)
        task.add_done_callback(self._once.discard)

    async def poll_all(self) -> None:
        machines = self.table.alive()
        await asyncio.gather(*(self.poll(m.ip) for m in machines))

    async def poll(self, ip: str) -> None:
        assert self._http is not None
        host = f"[{ip}]" if ":" in ip else ip
        started = time.perf_counter()
        try:
            response = await self._http.get(f"http://{host}:{self.port}/list", headers={
                H.USER_AGENT: H.USER_AGENT_MACHINE, **self.identity()})
            rows = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("poll of machine %s failed: %s", ip, exc)
            rows = None
        except Exception as exc:   # e.g. httpx.InvalidURL: raised, it would end the poller (all machines)
            log.warning("poll of machine %s failed: %r", ip, exc)
            rows = None
        if not isinstance(rows, list):
            self.table.polled(ip, None)
            return
        self.table.polled(ip, time.perf_counter() - started)
        machine = self.table.machines.get(ip)
        if machine is not None:   # it may tell its name and group (they change over time)
            machine.name = response.headers.get(H.MACHINE_NAME, machine.name)
            machine.group_name = response.headers.get(H.MACHINE_GROUP, machine.group_name)
        self.table.merge(rows)

    async def _run(self) -> None:
        while True:
            still_wanted()
            await self.poll_all()
            await asyncio.sleep(self.period_s)
