"""The peer list a node builds from heartbeats: failure detection without I/O, clock-injected."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from broker.messages import Heartbeat
from nodes.settings import host_of


class PeerStatus(enum.Enum):
    ALIVE = "alive"          # heard from within suspect_after periods; offered to schedulers
    SUSPECTED = "suspected"  # silent too long: no longer offered, still remembered
    REMOVED = "removed"      # silent past remove_after: forgotten, except for a tombstone


@dataclass(frozen=True, slots=True)
class PeerLoad:
    """A peer's load as its newest heartbeat told it (``at``: the heartbeat's own time)."""

    running: int
    queued: int
    slots: int          # K, parallel_running_functions_max
    queue_max: int
    at: float

    @property
    def free_slots(self) -> int:
        """Slots neither running nor promised to a queued task (a forward there runs at once)."""
        return max(0, self.slots - self.running - self.queued)


@dataclass(slots=True)
class _Peer:
    heartbeat: Heartbeat
    seen_at: float     # local clock when its newest heartbeat arrived
    first_seen: int    # order of first sighting: the P2PFaaS ``_id``


class MembershipView:
    """Who is alive, from heartbeats stamped by their sender (``Heartbeat.time``).

    * a peer silent for more than ``suspect_after`` periods is suspected (left
      out of :meth:`alive`), for more than ``remove_after`` periods removed;
    * a heartbeat counts only if its ``time`` is newer than the newest we ever had from that peer,
      also after removal (a tombstone keeps it): an old heartbeat never resurrects a peer;
    * our own heartbeats are ignored: :meth:`alive` never lists this node.

    ``now`` is wall time (``time.time()``), so that :meth:`as_p2pfaas_list`'s times mean something.
    """

    def __init__(
        self,
        self_id: str,
        period_s: float = 1.0,
        suspect_after: int = 3,
        remove_after: int = 10,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        if suspect_after < 1 or remove_after <= suspect_after:
            raise ValueError(
                "need 1 <= suspect_after < remove_after (missed periods), "
                f"got suspect_after={suspect_after}, remove_after={remove_after}"
            )
        self.self_id = self_id
        self.period_s = period_s
        self.suspect_after = suspect_after
        self.remove_after = remove_after
        self._peers: dict[str, _Peer] = {}
        self._newest: dict[str, float] = {}  # newest Heartbeat.time per node, kept after removal
        self._sightings = 0

    def observe(self, hb: Heartbeat, now: float) -> bool:
        """Take a heartbeat in; True if it was news (refreshed or (re)admitted a peer)."""
        if hb.node == self.self_id:
            return False
        newest = self._newest.get(hb.node)
        if newest is not None and hb.time <= newest:
            return False  # stale: replayed, duplicated or reordered
        self._newest[hb.node] = hb.time
        peer = self._peers.get(hb.node)
        if peer is None:
            self._sightings += 1
            self._peers[hb.node] = _Peer(hb, now, self._sightings)
        else:
            peer.heartbeat, peer.seen_at = hb, now
        return True

    def missed_periods(self, node: str, now: float) -> int:
        """Whole heartbeat periods elapsed since the peer's newest heartbeat arrived."""
        peer = self._peers[node]
        return max(0, math.floor((now - peer.seen_at) / self.period_s))

    def status(self, node: str, now: float) -> PeerStatus | None:
        """ALIVE, SUSPECTED or REMOVED; None for a node never heard of."""
        peer = self._peers.get(node)
        if peer is None:
            return PeerStatus.REMOVED if node in self._newest else None
        silent = now - peer.seen_at
        if silent > self.remove_after * self.period_s:
            return PeerStatus.REMOVED
        if silent > self.suspect_after * self.period_s:
            return PeerStatus.SUSPECTED
        return PeerStatus.ALIVE

    def sweep(self, now: float) -> list[str]:
        """Forget peers silent past ``remove_after`` (queries do not depend on it); the ones removed now."""
        gone = [n for n in self._peers if self.status(n, now) is PeerStatus.REMOVED]
        for node in gone:
            del self._peers[node]
        return sorted(gone)

    def alive(self, now: float) -> list[str]:
        """Alive peers, this node excluded, sorted by id (a stable order for schedulers)."""
        return sorted(n for n in self._peers if self.status(n, now) is PeerStatus.ALIVE)

    def suspected(self, now: float) -> list[str]:
        return sorted(n for n in self._peers if self.status(n, now) is PeerStatus.SUSPECTED)

    def heartbeat(self, node: str) -> Heartbeat | None:
        """The newest heartbeat of a peer not yet swept (its address, load, version)."""
        peer = self._peers.get(node)
        return peer.heartbeat if peer else None

    def load(self, node: str, now: float) -> PeerLoad | None:
        """The load an alive peer reported in its newest heartbeat (None if not alive)."""
        if self.status(node, now) is not PeerStatus.ALIVE:
            return None
        hb = self._peers[node].heartbeat
        return PeerLoad(hb.running, hb.queued, hb.parallel_running_functions_max, hb.queue_length_max, hb.time)

    def loads(self, now: float) -> dict[str, PeerLoad]:
        return {node: load for node in self.alive(now) if (load := self.load(node, now)) is not None}

    def as_p2pfaas_list(self, now: float) -> list[dict[str, object]]:
        """The alive peers as P2PFaaS discovery's ``GET /list``: ``_id`` the order of first sighting,
        ``ping`` the newest heartbeat's one-way delay in s (0 if the clocks disagree), ``last_update``
        its arrival in whole seconds, ``dead_polls`` the periods missed since."""
        rows: list[dict[str, object]] = []
        for node in self.alive(now):
            peer = self._peers[node]
            hb = peer.heartbeat
            rows.append({
                "_id": peer.first_seen,
                "ip": host_of(hb.address),
                "name": hb.node,
                "group_name": hb.group,
                "ping": max(0.0, peer.seen_at - hb.time),
                "last_update": int(peer.seen_at),
                "alive": True,
                "dead_polls": self.missed_periods(node, now),
                "address": hb.address,
            })
        return rows
