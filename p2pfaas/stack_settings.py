"""What ``p2pfaas up`` starts: its settings (flags and the ``--config`` file) and the endpoints it
reports (``DATA_DIR/endpoints.json``, read back by the commands that attach to it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError, model_validator

from broker.edge import Invitation
from broker.embedded import port_is_free
from broker.messages import NodeConfiguration, SchedulerConfiguration
from controller.scenario import load_scenario
from nodes.settings import DEFAULT_WORKER_IMAGE, NodeSettings, PoolSpec

MqttMode = Literal["nats", "mosquitto", "off"]
FARM_POOL = "farm"
FARM_FUNCTION = "sleep"
EDGE_UNKNOWN_AFTER_S = 2.0  # a device refuses a call stored for another device's node this soon


class NodeSpec(BaseModel):
    """One node of a ``--config`` file; every field is optional (CLI flags give the defaults)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")  # default n<i>
    k: int | None = Field(default=None, ge=1, le=1024)       # parallel_running_functions_max
    queue: int | None = Field(default=None, ge=0)            # queue_length_max
    queue_enabled: bool | None = None
    speed: float = Field(default=1.0, gt=0, le=1.0)          # < 1 emulates a slower machine
    group: str | None = None
    scheduler: SchedulerConfiguration | None = None


class DiscoveryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    heartbeat_period_s: float | None = Field(default=None, gt=0)
    suspect_after: int | None = Field(default=None, ge=1)
    remove_after: int | None = Field(default=None, ge=2)
    probe_timeout_s: float | None = Field(default=None, gt=0)


class StackConfig(BaseModel):
    """The ``p2pfaas up --config FILE`` document (JSON; see docs/p2p.md).

    ``nodes`` lists heterogeneous nodes; when it is empty, ``--nodes N`` identical
    ones are started. ``scheduler`` is the default algorithm of every node.
    """

    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeSpec] = Field(default_factory=list)
    scheduler: SchedulerConfiguration | None = None
    discovery: DiscoveryOptions = DiscoveryOptions()
    # LearningScheduler rewards: deadline (s) per task type, and for unlisted types (docs/learning.md)
    task_type_deadlines: dict[int, PositiveFloat] = Field(default_factory=dict)
    task_deadline_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _unique_ids(self) -> "StackConfig":
        ids = [spec.id or f"n{i + 1}" for i, spec in enumerate(self.nodes)]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids must be unique, got {ids}")
        return self

    @classmethod
    def load(cls, path: Path) -> "StackConfig":
        """Parse the file; ValueError names the file and what is wrong."""
        try:
            return cls.model_validate(orjson.loads(path.read_bytes()))
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc}") from None
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"{path}: {problems}") from None


@dataclass
class StackSettings:
    nodes: int = 3
    http_port: int = 18080
    host: str = "127.0.0.1"
    nats_url: str | None = None          # None: start the embedded nats-server
    nats_port: int = 4222
    mqtt: MqttMode = "nats"
    mqtt_url: str | None = None          # bridge to an MQTT broker that already runs
    mqtt_port: int = 1883
    data_dir: Path = Path("data")
    prefix: str = "faas"
    runtime: Literal["process", "inprocess", "docker"] = "process"
    worker_image: str = DEFAULT_WORKER_IMAGE   # runtime "docker": the workers' containers' image
    worker_user: str = "auto"           # docs/security.md: the user worker processes run as
    worker_writable: list[Path] = field(default_factory=list)   # where functions may write besides the temp dirs
    configuration: NodeConfiguration = field(default_factory=NodeConfiguration)
    functions: list[tuple[str, str]] = field(default_factory=list)
    max_payload_bytes: int = 1024 * 1024
    config: StackConfig = field(default_factory=StackConfig)   # heterogeneous nodes, scheduler, discovery
    # autoscaled farm pool on the first node ("farm": the `sleep` function), run by a live
    # controller; None switches both off (docs/autoscaling.md)
    controller_policy: str | None = "auto"
    farm_scenario: str = "bursty"
    models_dir: Path = Path("data/models")
    http_processes: int = 1             # HTTP bridge processes per node (SO_REUSEPORT)
    # docs/security.md: identities on every transport (off: anyone who reaches a port may do anything)
    secure: bool = True
    require_invoke_token: bool = False  # HTTP invocation needs a token too (it is open by default, as in OpenFaaS)
    callback_hosts: list[str] = field(default_factory=list)   # hosts X-Callback-Url may name
    tls: bool = False                   # NATS, MQTT and HTTP over TLS (a CA of our own under <data-dir>/tls)
    # P2PFaaS's layout (docs/compat.md): node i on its own loopback address <net>.i, with the
    # scheduler API on http_port, discovery on discovery_port and the learner on learner_port
    loopback_hosts: bool = False
    loopback_net: str = "127.0.0"
    discovery_port: int = 19000
    learner_port: int = 19020
    node_rewards: bool = True           # LearningScheduler: the nodes publish their own deadline rewards
    # a device of a hub (docs/edge.md): one node, named and grouped by its invitation, on this
    # machine's address ``host`` with P2PFaaS's ports; its nats-server a leaf of the hub's
    edge: Invitation | None = None
    p2pfaas_open: bool = False          # a device's P2PFaaS discovery and learner ports take changes without a token

    @property
    def p2pfaas_ports(self) -> bool:
        """Each node serves P2PFaaS's discovery and learner APIs on ports of their own."""
        return self.loopback_hosts or self.edge is not None

    def busy_ports(self, named: set[str]) -> list[str]:
        """Of the ports the user named (``http``, ``nats``, ``mqtt``), those taken: a port given on
        purpose is never replaced by another (only a busy default is)."""
        wanted: list[tuple[str, str, str, int]] = []   # flag, whose, host, port
        if "http" in named and self.http_port:
            wanted += [("--http-port", f"node {i + 1}'s port" if self.node_count > 1 else "port", self.node_host(i),
                        self.http_port if self.p2pfaas_ports else self.http_port + i) for i in range(self.node_count)]
        if "nats" in named and self.nats_port and not self.nats_url:
            wanted.append(("--nats-port", "port", self.host, self.nats_port))
        if "mqtt" in named and self.mqtt_port and self.mqtt != "off" and not self.mqtt_url:
            wanted.append(("--mqtt-port", "port", self.host, self.mqtt_port))
        return [f"{flag}: {whose} {port} is busy on {host}: give another, 0 for a free one, or leave {flag} out "
                f"(a busy default is replaced and reported)"
                for flag, whose, host, port in wanted if not port_is_free(port, host)]

    def node_host(self, i: int) -> str:
        """The address node i (0-based) listens on: its own in the P2PFaaS layout, else ``host``."""
        return f"{self.loopback_net}.{i + 1}" if self.loopback_hosts else self.host

    def node_settings(self, nats_url: str, addresses: list[str]) -> list[NodeSettings]:
        """One NodeSettings per node: CLI flags, overridden by the config file's defaults and node entries."""
        specs = [NodeSpec(id=self.edge.device)] if self.edge is not None else (
            self.config.nodes or [NodeSpec() for _ in range(self.nodes)])
        discovery = self.config.discovery.model_dump(exclude_none=True)
        out = []
        for i, spec in enumerate(specs):
            base = self.configuration
            initial = NodeConfiguration(
                parallel_running_functions_max=spec.k or base.parallel_running_functions_max,
                queue_length_max=spec.queue if spec.queue is not None else base.queue_length_max,
                queue_enabled=spec.queue_enabled if spec.queue_enabled is not None else base.queue_enabled,
            )
            extra: dict[str, object] = dict(discovery)
            if self.p2pfaas_ports:   # peers that are original P2PFaaS nodes use the same ports
                extra.update(peer_scheduler_port=self.http_port, peer_discovery_port=self.discovery_port)
            if self.edge is not None:   # calls stored here for another device's node are refused at once
                extra.update(edge=True, group=self.edge.group, unknown_node_after_s=EDGE_UNKNOWN_AFTER_S)
            if self.config.task_type_deadlines:
                extra["task_type_deadlines"] = self.config.task_type_deadlines
            if self.config.task_deadline_s is not None:
                extra["task_deadline_s"] = self.config.task_deadline_s
            scheduler = spec.scheduler or self.config.scheduler
            if scheduler is not None:
                extra["initial_scheduler"] = scheduler
            if spec.group:
                extra["group"] = spec.group
            if i == 0 and self.controller_policy is not None:
                extra["pools"] = {FARM_POOL: self.farm_pool_spec()}
            out.append(NodeSettings(node_id=spec.id or f"n{i + 1}", nats_url=nats_url, prefix=self.prefix,
                                    data_dir=self.data_dir, runtime=self.runtime, docker_image=self.worker_image,
                                    initial=initial,
                                    worker_user=self.worker_user, worker_writable=self.worker_writable,
                                    functions=self.functions, max_payload_bytes=self.max_payload_bytes,
                                    address=addresses[i], speed=spec.speed, node_rewards=self.node_rewards, **extra))
        return out

    def farm_pool_spec(self) -> PoolSpec:
        """The farm pool spans the scenario's worker bounds and starts where its episodes start."""
        scenario = load_scenario(self.farm_scenario)
        bounds = scenario.workers
        return PoolSpec(functions=[FARM_FUNCTION], initial=bounds.initial, min=bounds.min, max=bounds.max,
                        period_s=scenario.step_seconds)

    @property
    def node_count(self) -> int:
        return 1 if self.edge is not None else len(self.config.nodes) or self.nodes

    @property
    def node_ids(self) -> list[str]:
        if self.edge is not None:
            return [self.edge.device]
        return [spec.id or f"n{i + 1}" for i, spec in enumerate(self.config.nodes or [NodeSpec()] * self.nodes)]


@dataclass
class Endpoints:
    nats_url: str = ""
    mqtt_url: str | None = None
    mqtt_via: str = "off"
    http: dict[str, str] = field(default_factory=dict)
    discovery: dict[str, str] = field(default_factory=dict)   # P2PFaaS layout: discovery API per node
    learner: dict[str, str] = field(default_factory=dict)     # P2PFaaS layout: learner API per node
    controller: str | None = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"NATS        {self.nats_url}"]
        if self.mqtt_url:
            out.append(f"MQTT        {self.mqtt_url}  ({self.mqtt_via})")
        for node, url in self.http.items():
            out.append(f"HTTP {node:<6} {url}  (ui {url}/ui, docs {url}/docs, metrics {url}/metrics)")
            if node in self.discovery:
                out.append(f"     {'':<6} discovery {self.discovery[node]}  learner {self.learner[node]}")
        if self.controller:
            out.append(f"autoscaling {self.controller}")
        return out


def read_endpoints(data_dir: Path) -> dict:
    """Endpoints a running ``p2pfaas up`` wrote, or {} (used by ``invoke`` defaults)."""
    path = data_dir / "endpoints.json"
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
