"""What the scheduler and the forwarder need from discovery; the peer-to-peer layer
(:mod:`nodes.discovery.service`) fills it in, and a node without peers keeps these answers."""

from __future__ import annotations

from typing import Sequence

import httpx


class PeerSource:
    """What the scheduler needs from discovery (filled in by the peer-to-peer layer)."""

    http: "httpx.AsyncClient | None" = None   # reaches the peers that speak P2PFaaS's HTTP API

    def peers(self) -> Sequence[str]:
        return ()

    async def probe(self, peer: str) -> int | None:
        return None

    def http_base(self, peer: str) -> str | None:
        """The scheduler API URL of a peer that speaks P2PFaaS's HTTP API (None: a p2pfaas node)."""
        return None

    def unreachable(self, peer: str, reason: str) -> None:
        """A forward to ``peer`` over HTTP failed in transit: do not choose it until it shows it is alive."""

    def resolve(self, name: str) -> str:
        """The peer id of a node named by its address (P2PFaaS names its master by IP)."""
        return name
