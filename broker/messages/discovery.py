"""Heartbeats and peers: who is alive in a group, and P2PFaaS's discovery API."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import ConfigDict, Field, RootModel

from broker.messages.base import Contract


class Heartbeat(Contract):
    """Membership heartbeat on ``faas.membership.<group>.<node>``."""

    node: str
    address: str = ""
    group: str = "default"
    running: int = 0
    queued: int = 0
    parallel_running_functions_max: int = 0
    queue_length_max: int = 0
    version: str = ""
    time: float = Field(default_factory=time.time)
    scheduler: str = ""                                       # e.g. PowerOfNScheduler(1, 2, true, 1)
    forwards: dict[str, int] = Field(default_factory=dict)    # forwards to each peer since the last heartbeat


class PeerInfo(Contract):
    """One alive peer, as a row of P2PFaaS discovery ``GET /list``."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    id: int = Field(alias="_id")   # order of first sighting
    ip: str                        # the machine's IP address (the host of its advertised address)
    name: str                      # node id
    group_name: str
    ping: float                    # one-way delay of the newest heartbeat, seconds
    last_update: int               # unix seconds of the newest heartbeat
    alive: bool
    dead_polls: int                # heartbeat periods missed since
    address: str = ""              # what the peer advertises (e.g. its HTTP bridge's URL)
    protocol: Literal["nats", "http"] = "nats"   # how this node reaches it (http: an original P2PFaaS node)


class MachineAnnouncement(Contract):
    """A P2PFaaS machine announcing itself (``User-Agent: Machine`` and the ``p2pfaas-machine-*``
    headers of discovery's ``GET /list``), on ``faas.<node>.discovery.register``; the answer is
    the node's :class:`PeerList`."""

    ip: str = Field(min_length=1, max_length=64)
    name: str = Field(default="", max_length=256)
    group_name: str = Field(default="", max_length=256)


class DiscoveryConfiguration(Contract):
    """P2PFaaS discovery's ``/configuration`` body (``faas.<node>.discovery.config.get|set``)."""

    machine_ip: str = ""
    machine_id: str = ""
    machine_group_name: str = ""
    init_servers: list[str] = Field(default_factory=list)


class PeerList(RootModel[list[PeerInfo]]):
    """Answer of ``faas.<node>.peers``: a bare JSON array, as P2PFaaS ``GET /list``."""

    model_config = ConfigDict(frozen=True)
