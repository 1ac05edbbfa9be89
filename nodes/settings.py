"""Settings of one node (one pydantic object; defaults run the embedded stack)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from broker.messages import NodeConfiguration, SchedulerConfiguration

ONE_MIB = 1024 * 1024


def host_of(address: str) -> str:
    """``http://10.0.0.5:18080`` -> ``10.0.0.5``; a bare host (or IP) is returned as it is."""
    if "://" in address:
        return urlsplit(address).hostname or ""
    return address
TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def comma_separated(value: object) -> object:
    """A setting's list as an option or variable gives it, ``a, b``: its items, empty ones left out."""
    return [item.strip() for item in value.split(",") if item.strip()] if isinstance(value, str) else value


DEFAULT_WORKER_IMAGE = "p2pfaas-worker:latest"   # `p2pfaas image build` makes it


class PoolSpec(BaseModel):
    """A dedicated, autoscaled worker pool for some functions (the farm, docs/autoscaling.md): its tasks
    are always queued (no admission control); the controller keeps its QoS by scaling min..max."""

    model_config = ConfigDict(extra="forbid")

    functions: list[str] = Field(min_length=1)
    initial: int = Field(default=1, ge=0)
    min: int = Field(default=1, ge=0)
    max: int = Field(default=32, ge=1, le=256)
    period_s: float | None = Field(default=None, gt=0)  # telemetry/control period (None: the node's)
    # with min 0: scaled to zero after this long without a call; the next call wakes it (None: never)
    zero_after_s: float | None = Field(default=None, gt=0)
    # a function's own pool (a deployment's scaling, secrets or limits: nodes/deployments.py)
    function_pool: bool = False
    secrets: list[str] = Field(default_factory=list)   # names of the deployment's secrets its workers get
    memory_bytes: int | None = Field(default=None, ge=1)   # one worker's memory (address space)
    cpus: float | None = Field(default=None, gt=0)          # one worker's CPU share

    @model_validator(mode="after")
    def _ordered(self) -> "PoolSpec":
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"pool sizes must satisfy min <= initial <= max, got {self.min}, {self.initial}, {self.max}")
        if self.zero_after_s is not None and self.min > 0:
            raise ValueError("zero_after_s needs min 0")
        return self

    @property
    def wake_size(self) -> int:
        """Workers a call starts in a pool scaled to zero (Knative's activator: one, then the policy)."""
        return max(1, self.min)


class FunctionOptions(BaseModel):
    """What a deployment sets of a function that its code would otherwise say."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, ge=1)
    memory_bytes: int | None = Field(default=None, ge=1)   # an image function's container
    cpus: float | None = Field(default=None, gt=0)


class Timings(BaseModel):
    """How long a node waits before it concludes something. ``forward_*`` must be the same on every
    node: a peer notices at its own ``forward_notice_every_s``, the origin judges by its own silence."""

    model_config = ConfigDict(extra="forbid")

    stop_grace_s: float = Field(default=10.0, gt=0)           # a stopping worker (and node) finishes calls this long
    worker_check_after_s: float = Field(default=10.0, gt=0)   # a call running this long is checked with its worker
    store_check_every_s: float = Field(default=5.0, gt=0)     # how often the intake's store room is checked
    forward_notice_every_s: float = Field(default=2.5, gt=0)  # a node holding a forwarded call says so this often
    forward_silent_after_s: float = Field(default=15.0, gt=0)  # a forward that heard nothing this long is lost
    dropped_log_every_s: float = Field(default=5.0, gt=0)     # calls not run: one summary line at most this often

    @model_validator(mode="after")
    def _notices_fit(self) -> "Timings":
        if self.forward_silent_after_s <= 2 * self.forward_notice_every_s:
            raise ValueError("forward_silent_after_s must exceed twice forward_notice_every_s (one notice may be late)")
        return self


class NodeSettings(BaseSettings):
    """Every field also comes from ``P2PFAAS_<FIELD>`` (JSON for lists, maps and models; SEEDS and
    FUNCTIONS comma-separated as the CLI takes them; ``P2PFAAS_TIMINGS__STOP_GRACE_S`` for one field
    of a model). Explicit values win over the environment, which wins over the defaults; a worker
    gets its node's settings whole (``model_validate_json``), never from its environment."""

    model_config = SettingsConfigDict(env_prefix="P2PFAAS_", env_ignore_empty=True, extra="forbid",
                                      env_nested_delimiter="__")

    node_id: str = Field(default="n1", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "faas"
    data_dir: Path = Path("data")
    address: str = ""                      # advertised (e.g. its HTTP bridge URL)
    max_payload_bytes: int = Field(default=ONE_MIB, ge=1)
    runtime: Literal["process", "inprocess", "docker"] = "process"
    docker_image: str = DEFAULT_WORKER_IMAGE      # runtime "docker": the workers' image (docs/containers.md)
    # runtime "docker": the workers' network: the host's, or the node's (compose's: its NATS URL resolves there)
    docker_network: str = Field(default="host", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    # main pool processes: K at most this (None: nodes.pool.machine_worker_limit, from cores and memory);
    # K beyond it bounds the calls running at once, not processes
    worker_processes_max: int | None = Field(default=None, ge=1, le=1024)
    # runtime "process": the workers' user, a name or uid; "auto": nobody when the node runs as root
    # (if nobody can run them), else the node's own (docs/security.md)
    worker_user: str = Field(default="auto", pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}$")
    worker_writable: list[Path] = Field(default_factory=list)   # where functions may write besides the temp dirs
    ack_wait_s: float = Field(default=10.0, gt=0)   # a silent worker's task is redelivered after this
    max_deliver: int = Field(default=4, ge=2)       # counted by the node: this delivery is not run, it dead-letters
    # a task whose worker died is delivered again after these seconds (the n-th retry waits the n-th,
    # the last repeats); a function's own ``p2pfaas_retry_backoff_s`` wins
    retry_backoff_s: list[PositiveFloat] = Field(default_factory=lambda: [1.0, 2.0, 4.0], min_length=1)
    # bytes async calls pulled and not yet answered may hold (None: 1/16 of the memory, at least 64 MiB)
    intake_hold_bytes: int | None = Field(default=None, ge=1)
    timings: Timings = Timings()
    unknown_node_after_s: float = Field(default=60.0, gt=0)   # async calls to a node never seen: refused after
    # a device of a hub (docs/edge.md): its streams hold its own calls only; one for another device's
    # node is refused (after unknown_node_after_s), never kept
    edge: bool = False
    functions: Annotated[list[tuple[str, str]], NoDecode] = Field(default_factory=list)  # user (name, module:function)
    # deployed functions' envVars by function: a worker process sets those of every function it
    # loads, an image function's container gets its own
    function_env: dict[str, dict[str, str]] = Field(default_factory=dict)
    function_options: dict[str, FunctionOptions] = Field(default_factory=dict)   # by function
    initial: NodeConfiguration = NodeConfiguration()
    # P2PFaaS's default algorithm
    initial_scheduler: SchedulerConfiguration = SchedulerConfiguration(name="PowerOfNScheduler",
                                                                       parameters=["1", "2", "true", "1"])
    telemetry_period_s: float = Field(default=1.0, gt=0)
    learner: bool = True                   # run this node's learner service (nodes/learner/)
    pools: dict[str, PoolSpec] = Field(default_factory=dict)  # dedicated autoscaled pools by name
    # emulated slowness: every execution is padded to last 1/speed times longer (1.0 = as is)
    speed: float = Field(default=1.0, gt=0, le=1.0)
    # discovery (docs/p2p.md)
    group: str = "default"                            # P2PFaaS group_name of this node
    seeds: Annotated[list[str], NoDecode] = Field(default_factory=list)   # more NATS URLs of the cluster: connect + failover
    heartbeat_period_s: float = Field(default=1.0, gt=0)
    suspect_after: int = Field(default=3, ge=1)       # missed periods before a peer is no longer offered
    remove_after: int = Field(default=10, ge=2)       # missed periods before a peer is forgotten
    probe_timeout_s: float = Field(default=0.25, gt=0)  # a slower load probe counts as a fully loaded peer
    # original P2PFaaS nodes in the cluster (docs/compat.md): their ports, and discovery's polling
    peer_scheduler_port: int = Field(default=18080, ge=1, le=65535)   # where they take /peer/function
    peer_discovery_port: int = Field(default=19000, ge=1, le=65535)   # where their /list is polled
    machine_poll_period_s: float = Field(default=120.0, gt=0)         # P2PFaaS's poll period
    machine_poll_timeout_s: float = Field(default=5.0, gt=0)
    machine_dead_polls: int = Field(default=20, ge=1)                 # failed polls before a machine is dead
    init_servers: list[str] = Field(default_factory=list)             # IPs of P2PFaaS machines to start from
    # LearningScheduler: the node publishes a deadline reward per decision; off when clients post them
    # (P2PFaaS's benchmark client with -learning); an EID's first stored reward counts (docs/compat.md)
    node_rewards: bool = True
    # LearningScheduler rewards (docs/learning.md): each task type's QoS deadline, s (met: answered 200
    # within it); unlisted types get task_deadline_s
    task_type_deadlines: dict[int, PositiveFloat] = Field(default_factory=dict)
    task_deadline_s: float = Field(default=1.0, gt=0)

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_list(cls, value: object) -> object:
        return comma_separated(value)

    @field_validator("functions", mode="before")
    @classmethod
    def _function_list(cls, value: object) -> object:
        """"a=pkg.mod:f,b=pkg.mod:g", as --function takes them (functions/registry.py)."""
        if not isinstance(value, str):
            return value
        from functions.registry import parse_function_specs
        return parse_function_specs(value)

    @model_validator(mode="after")
    def _periods_in_order(self) -> "NodeSettings":
        if self.remove_after <= self.suspect_after:
            raise ValueError(f"remove_after ({self.remove_after}) must exceed suspect_after ({self.suspect_after})")
        return self

    @model_validator(mode="after")
    def _pools_disjoint(self) -> "NodeSettings":
        owner: dict[str, str] = {}
        for pool, spec in self.pools.items():
            if pool == "default" or not TOKEN.match(pool):
                raise ValueError(f"pool name {pool!r} must match [A-Za-z0-9_-]{{1,64}} and not be 'default'")
            for fn in spec.functions:
                if fn in owner:
                    raise ValueError(f"function {fn!r} is in two pools ({owner[fn]}, {pool})")
                owner[fn] = pool
        return self

    @property
    def nats_servers(self) -> str | list[str]:
        """What nats.connect gets: the URL alone, or it and the seeds (the client tries each)."""
        return [self.nats_url, *self.seeds] if self.seeds else self.nats_url

    @property
    def machine_ip(self) -> str:
        """This node's address as P2PFaaS names a machine: the host of ``address`` (a URL or a bare host)."""
        return host_of(self.address)

    @property
    def node_dir(self) -> Path:
        return self.data_dir / "nodes" / self.node_id

    @property
    def run_dir(self) -> Path:
        """Pid files of the node's worker processes (strays of a previous run are ended at start)."""
        return self.node_dir / "run"


def machine_memory() -> int:
    """This machine's memory in bytes (4 GiB when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * 1024 ** 3


def memory_share() -> int:
    """Bytes of inputs an in-memory backlog may hold: 1/16 of the machine's memory, at least 64 MiB."""
    return max(64 * ONE_MIB, machine_memory() // 16)


def pool_functions(settings: NodeSettings, pool: str) -> tuple[list[tuple[str, str]], dict[str, dict[str, str]]]:
    """The user functions (name, reference) and variables a worker of ``pool`` loads: a dedicated
    pool's own, the main pool every other one (so a function's secrets stay in its own pool)."""
    spec = settings.pools.get(pool)
    if spec is not None:
        wanted = set(spec.functions)
    else:
        elsewhere = {fn for other in settings.pools.values() for fn in other.functions}
        wanted = {name for name, _ in settings.functions} - elsewhere
    functions = [(name, ref) for name, ref in settings.functions if name in wanted]
    return functions, {name: env for name, env in settings.function_env.items() if name in wanted}
