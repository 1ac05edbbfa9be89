"""``p2pfaas up`` and the parts it runs, one by one: ``node``, ``bridge``, ``learner``."""

from __future__ import annotations

import asyncio
import os
import re
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from broker.errors import BrokerUnavailable
from broker.messages import NodeConfiguration
from controller.names import known
from nodes.settings import DEFAULT_WORKER_IMAGE
from p2pfaas.cli_common import (MAX_PORT, START_THE_STACK, MqttChoice, Runtime, _attach, _engine_has, _fail,
                                _failed_with, _functions, _importable, _logging, _policy_name, _reported,
                                _sandbox, _stop_on_signal, _usable_data_dir, console, serve_stack)


def up(
    ctx: typer.Context,
    nodes: int = typer.Option(3, "--nodes", min=1, max=64, help="Number of nodes (n1..nN); a --config node list wins."),
    config: Optional[Path] = typer.Option(None, "--config", help="JSON file: heterogeneous nodes (K, queue, speed, scheduler), discovery; see docs/p2p.md."),
    http_port: int = typer.Option(18080, min=0, max=MAX_PORT, help="HTTP bridge port of n1; node i gets PORT+i-1 (busy: the default is replaced, a port given here refused; 0: a free port each)."),
    nats_url: Optional[str] = typer.Option(None, help="Use this NATS instead of starting the embedded nats-server."),
    nats_port: int = typer.Option(4222, min=0, max=MAX_PORT, help="Port of the embedded nats-server (busy: the default is replaced, a port given here refused; 0: a free one)."),
    mqtt: MqttChoice = typer.Option(MqttChoice.nats, help="nats: nats-server's MQTT listener; mosquitto: start mosquitto + the MQTT bridge; off."),
    mqtt_url: Optional[str] = typer.Option(None, help="Bridge to an MQTT broker that already runs (mqtt://HOST:PORT)."),
    mqtt_port: int = typer.Option(1883, min=0, max=MAX_PORT, help="MQTT port to listen on (busy: the default is replaced, a port given here refused; 0: a free one)."),
    data_dir: Path = typer.Option(Path("data"), help="Streams, configuration and models live here."),
    parallel: int = typer.Option(4, "--k", min=1, max=1024, help="K: parallel running functions per node (changeable at run time)."),
    queue: int = typer.Option(4, min=0, max=100_000, help="Queue length max per node."),
    runtime: Runtime = typer.Option(Runtime.process, help="Workers as OS processes (real parallelism), inside the node, or as containers on the Docker engine DOCKER_HOST names (docs/containers.md)."),
    worker_image: str = typer.Option(DEFAULT_WORKER_IMAGE, help="--runtime docker: the workers' image (`p2pfaas image build` makes it)."),
    worker_user: str = typer.Option("auto", help="User the worker processes (user code) run as: a name or uid; auto: nobody when up runs as root and nobody can run them, else up's own (docs/security.md)."),
    worker_writable: list[Path] = typer.Option([], "--worker-writable", help="A directory functions may write to besides the temporary ones (repeatable)."),
    function: list[str] = typer.Option([], "--function", "-f", help="Add a function: name=package.module:callable (repeatable)."),
    controller: str = typer.Option("auto", help=f"Policy of the autoscaled farm pool on n1 (function sleep): auto (the RL model shipped in the package, learning online), or {known(auto=False, off=True)}."),
    scenario: str = typer.Option("bursty", help="Scenario whose worker bounds and normalisation the controller uses."),
    models_dir: Path = typer.Option(Path("data/models"), help="Where trained scaling models are looked up."),
    http_processes: int = typer.Option(1, min=1, max=32, help="HTTP bridge processes per node, sharing its port (more use more cores)."),
    insecure: bool = typer.Option(False, "--insecure", help="No identities: anyone who reaches a port may do anything (a private laptop only; docs/security.md)."),
    require_invoke_token: bool = typer.Option(False, help="HTTP invocation needs a bearer token too (open by default, as in OpenFaaS)."),
    callback_host: list[str] = typer.Option([], "--callback-host", help="A host X-Callback-Url may name (repeatable; none by default)."),
    tls: bool = typer.Option(False, "--tls", help="NATS, MQTT and HTTP over TLS, with a CA of the deployment's own under DATA_DIR/tls."),
    loopback_hosts: bool = typer.Option(False, "--loopback-hosts", help="P2PFaaS's layout: node i on 127.0.0.i with the scheduler API on --http-port (18080), discovery on 19000 and the learner on 19020, as P2PFaaS's clients expect one host per node."),
    loopback_net: str = typer.Option("127.0.0", help="With --loopback-hosts: node i listens on NET.i (any 127.x.y network works on Linux)."),
    node_rewards: bool = typer.Option(True, "--node-rewards/--no-node-rewards", help="LearningScheduler: the nodes publish their own deadline rewards; off when clients post them (P2PFaaS's benchmark client with -learning)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO."),
) -> None:
    """Start the whole stack: nats-server (JetStream), nodes with worker pools and learners, the autoscaling controller, HTTP and MQTT access. Every part is a supervised process (restarted when it dies; logs in DATA_DIR/logs). Ctrl-C stops it."""
    from broker import handoff
    from p2pfaas.stack_settings import StackConfig, StackSettings

    handoff.take()   # up holds every identity: not dumpable, and none in its children's environment
    _logging(verbose)
    if not re.fullmatch(r"127\.\d{1,3}\.\d{1,3}", loopback_net):
        raise typer.BadParameter(f"{loopback_net!r} must be the first three numbers of a 127/8 address, e.g. 127.0.0",
                                 param_hint="--loopback-net")
    try:
        stack_config = StackConfig.load(config) if config else StackConfig()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    last_http_port = http_port + (len(stack_config.nodes) or nodes) - 1
    if http_port and not loopback_hosts and last_http_port > MAX_PORT:
        raise typer.BadParameter(f"{http_port} leaves no port for the last node ({last_http_port} > {MAX_PORT}): "
                                 f"give at most {MAX_PORT - last_http_port + http_port}, or 0 for free ports",
                                 param_hint="--http-port")
    with _reported(ValueError):
        functions = _functions(function)
    controller = _policy_name(controller, "--controller", off=True)
    sandbox = None
    if runtime is Runtime.process:
        sandbox = _sandbox(data_dir=data_dir, functions=functions, worker_user=worker_user,
                           worker_writable=worker_writable)
    _importable(functions, sandbox)
    if runtime is Runtime.docker:
        _engine_has(worker_image, "p2pfaas image build")
    settings = StackSettings(
        nodes=nodes, http_port=http_port, nats_url=nats_url, nats_port=nats_port, mqtt=mqtt.value,
        mqtt_url=mqtt_url, mqtt_port=mqtt_port, data_dir=data_dir, runtime=runtime.value, worker_image=worker_image,
        worker_user=worker_user, worker_writable=worker_writable,
        configuration=NodeConfiguration(parallel_running_functions_max=parallel, queue_length_max=queue),
        functions=functions, config=stack_config,
        controller_policy=None if controller == "off" else controller, farm_scenario=scenario, models_dir=models_dir,
        http_processes=http_processes, secure=not insecure, require_invoke_token=require_invoke_token,
        callback_hosts=callback_host, tls=tls, loopback_hosts=loopback_hosts, loopback_net=loopback_net,
        node_rewards=node_rewards,
    )
    named = {flag for flag in ("http", "nats", "mqtt")
             if getattr(ctx.get_parameter_source(f"{flag}_port"), "name", "") == "COMMANDLINE"}
    for busy in settings.busy_ports(named):
        _fail(busy)
    _usable_data_dir(data_dir)
    serve_stack(settings)

def node(
    node_id: Optional[str] = typer.Option(None, "--id", help="Node id (env P2PFAAS_NODE_ID; default n1)."),
    nats_url: Optional[str] = typer.Option(None, help="NATS to attach to (env P2PFAAS_NATS_URL; default: the one of the `p2pfaas up` running on --data-dir, as its operator)."),
    seed: list[str] = typer.Option([], "--seed", help="More NATS URLs of the same cluster (repeatable) (env P2PFAAS_SEEDS)."),
    data_dir: Optional[Path] = typer.Option(None, help="Configuration directory, and the `p2pfaas up` whose NATS is the default (env P2PFAAS_DATA_DIR; default ./data)."),
    prefix: Optional[str] = typer.Option(None, help="Subject prefix (env P2PFAAS_PREFIX; default faas)."),
    heartbeat_period: Optional[float] = typer.Option(None, help="Discovery heartbeat period, s (env P2PFAAS_HEARTBEAT_PERIOD_S; default 1)."),
    address: Optional[str] = typer.Option(None, help="Address advertised to peers (e.g. its HTTP bridge URL); its host is the node's IP in P2PFaaS's lists."),
    peer_scheduler_port: Optional[int] = typer.Option(None, min=1, max=MAX_PORT, help="Scheduler API port of original P2PFaaS peers (default 18080)."),
    peer_discovery_port: Optional[int] = typer.Option(None, min=1, max=MAX_PORT, help="Discovery API port of original P2PFaaS peers, polled (default 19000)."),
    init_server: list[str] = typer.Option([], "--init-server", help="IP of a P2PFaaS machine to poll from the start (repeatable)."),
    node_rewards: Optional[bool] = typer.Option(None, "--node-rewards/--no-node-rewards", help="LearningScheduler: publish the node's own deadline rewards (off: clients post them to the learner API)."),
    runtime: Runtime = typer.Option(Runtime.process),
    worker_image: Optional[str] = typer.Option(None, help="--runtime docker: the workers' image (default p2pfaas-worker:latest)."),
    worker_network: Optional[str] = typer.Option(None, help="--runtime docker: the Docker network the workers join (default host; in compose, the node's own)."),
    worker_user: Optional[str] = typer.Option(None, help="User the worker processes run as (default auto: nobody when run as root, docs/security.md)."),
    function: list[str] = typer.Option([], "--function", "-f", help="name=package.module:callable (repeatable)."),
    settings_file: Optional[Path] = typer.Option(None, "--settings", help="All node settings as one JSON document (what `up` passes); the other options are then ignored."),
    http_port: Optional[int] = typer.Option(None, min=1, max=MAX_PORT, help="Also serve the node's HTTP bridge (P2PFaaS's :18080 API) from this process, as `up` does: a direct call then skips one hop through nats-server."),
    http_host: str = typer.Option("127.0.0.1", help="With --http-port: the address it listens on."),
    http_processes: int = typer.Option(1, min=1, max=32, help="With --http-port: HTTP bridge processes on the port, this one included (SO_REUSEPORT; the others go through NATS)."),
    discovery_port: Optional[int] = typer.Option(None, min=1, max=MAX_PORT, help="With --http-port: also P2PFaaS's discovery API on this port (P2PFaaS: 19000)."),
    learner_port: Optional[int] = typer.Option(None, min=1, max=MAX_PORT, help="With --http-port: also P2PFaaS's learner API on this port (P2PFaaS: 19020)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run one node (scheduler, discovery, learner, worker pool) against an existing NATS: by
    default the one of the `p2pfaas up` running on --data-dir. With --http-port, the node's
    HTTP bridge runs in the same process (docs/architecture.md).

    Prints READY on stdout once each pool has a ready worker (and the HTTP port serves); stops on
    SIGINT/SIGTERM (or when the process that started it ends), within a deadline."""
    from broker import handoff
    from broker.errors import NodeFileError
    from nodes.node import Node
    from nodes.settings import NodeSettings
    from p2pfaas.parts import HttpBridgeSettings, run_part, start_http_bridge, stop_http_bridge

    handoff.take()   # before anything starts a worker: its identities leave the environment workers inherit
    _logging(verbose)
    try:
        if settings_file is not None:
            settings = NodeSettings.model_validate_json(settings_file.read_bytes())
        else:
            given = dict(  # what is not given comes from P2PFAAS_* in the environment, then the defaults
                node_id=node_id, nats_url=nats_url, seeds=seed or None, data_dir=data_dir, prefix=prefix,
                heartbeat_period_s=heartbeat_period, address=address, runtime=runtime.value,
                functions=_functions(function) or None, peer_scheduler_port=peer_scheduler_port,
                peer_discovery_port=peer_discovery_port, init_servers=init_server or None, node_rewards=node_rewards,
                worker_user=worker_user, docker_image=worker_image, docker_network=worker_network)
            settings = NodeSettings(**{k: v for k, v in given.items() if v is not None})
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    store = None
    if settings_file is None:   # `up` checked its own before starting us (and named its NATS)
        sandbox = _sandbox(settings) if settings.runtime == "process" else None
        if settings.runtime == "docker":
            _engine_has(settings.docker_image, "p2pfaas image build --target worker")
        _importable(settings.functions, sandbox)
        url, store = _attach(settings.data_dir, nats_url or os.environ.get("P2PFAAS_NATS_URL"))
        settings = settings.model_copy(update={"nats_url": url})
        if store is not None and not handoff.get("P2PFAAS_SECRETS_KEY"):   # run by hand: as the stack's nodes
            handoff.hold(P2PFAAS_SECRETS_KEY=store.secrets_key())
    http = None
    if http_port is not None:
        if store is not None and not handoff.get("P2PFAAS_OPERATOR_TOKEN"):   # run by hand: as the stack's bridges
            handoff.hold(P2PFAAS_OPERATOR_TOKEN=store.operator_token())
        try:
            http = HttpBridgeSettings(node=settings.node_id, nats_url=settings.nats_url, host=http_host, port=http_port,
                                      prefix=settings.prefix, max_payload_bytes=settings.max_payload_bytes,
                                      processes=http_processes, discovery_port=discovery_port,
                                      learner_port=learner_port).with_secrets(in_node=True)
        except ValueError as exc:   # P2PFAAS_HTTP_LIMITS and the like
            raise typer.BadParameter(str(exc)) from None

    async def start():
        started = Node(settings)
        try:
            await started.start()
        except BaseException:   # what did start (workers, the learner) stops again
            await started.stop()
            raise
        # serving once every pool has a worker: with a large K the others keep starting meanwhile
        # (calls wait in the queue for them), so a node never takes minutes to come up
        await asyncio.gather(*(pool.wait_ready(120, at_least=1) for pool in started.pools.values()))
        if http is None:
            return started, None
        try:
            assert started.scheduler is not None
            return started, await start_http_bridge(http, door=started.ingress.door)
        except BaseException:
            await started.stop()
            raise

    async def stop(part) -> None:
        started, bridge = part
        # at once: HTTP callers still waiting get the answers the node gives while it stops
        await asyncio.gather(started.stop(), *([stop_http_bridge(bridge)] if bridge else []))

    def announce(part) -> None:
        serving = f"; HTTP on {http.host}:{http.port}" if http is not None else ""
        console.print(f"node {settings.node_id} attached to {settings.nats_url}{serving}; Ctrl-C to stop")

    from broker.errors import DataDirInUse
    # a file of the node's that is broken (a crash mid-write) is the user's to fix: said once, not a traceback
    with _reported(DataDirInUse, NodeFileError), _reported(BrokerUnavailable, todo=START_THE_STACK):
        run_part(start, stop, announce)

class BridgeKind(str, Enum):
    http = "http"
    mqtt = "mqtt"


def bridge(
    kind: BridgeKind = typer.Argument(..., help="http or mqtt"),
    node_id: str = typer.Option("n1", "--node", help="Node served by the HTTP bridge."),
    nats_url: Optional[str] = typer.Option(None, help="NATS to attach to (default: the one of the `p2pfaas up` running on --data-dir, as its operator)."),
    data_dir: Path = typer.Option(Path("data"), help="Where `p2pfaas up` wrote endpoints.json and its identities."),
    port: int = typer.Option(18080, min=1, max=MAX_PORT, help="HTTP port."),
    host: str = typer.Option("127.0.0.1"),
    prefix: str = typer.Option("faas", help="Subject prefix."),
    max_payload_bytes: int = typer.Option(1024 * 1024, help="Largest request body accepted (413 beyond)."),
    processes: int = typer.Option(1, min=1, max=32, help="HTTP bridge processes sharing the port (SO_REUSEPORT); more use more cores."),
    discovery_port: Optional[int] = typer.Option(None, min=1, max=MAX_PORT, help="Also serve P2PFaaS's discovery API on this port (P2PFaaS: 19000)."),
    learner_port: Optional[int] = typer.Option(None, min=1, max=MAX_PORT, help="Also serve P2PFaaS's learner API on this port (P2PFaaS: 19020)."),
    mqtt_url: str = typer.Option("mqtt://127.0.0.1:1883", help="Mosquitto to bridge (mqtt bridge)."),
    client_id: Optional[str] = typer.Option(None, help="MQTT client id of the bridge: stable across restarts, unique per bridge (default: p2pfaas-bridge-PREFIX-HOSTNAME)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run one bridge against an existing NATS (by default the one of the `p2pfaas up` running on
    --data-dir) and Mosquitto. Prints READY when serving."""
    from broker import handoff
    from p2pfaas.parts import HttpBridgeSettings, run_part, start_http_bridge, stop_http_bridge

    handoff.take()   # its identity and tokens: handed over by `up`, or exported by hand
    _logging(verbose)
    nats_url, store = _attach(data_dir, nats_url)
    if kind is BridgeKind.http:
        if store is not None and not handoff.get("P2PFAAS_OPERATOR_TOKEN"):   # run by hand: as the stack's bridges
            handoff.hold(P2PFAAS_OPERATOR_TOKEN=store.operator_token())        # (and our sibling processes) want it
        # secrets are handed over (`up` does) or exported, never on the command line
        try:
            options = HttpBridgeSettings(node=node_id, nats_url=nats_url, host=host, port=port, prefix=prefix,
                                         max_payload_bytes=max_payload_bytes, processes=processes,
                                         discovery_port=discovery_port, learner_port=learner_port).with_secrets()
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        extra = "".join(f", {what} :{p}" for what, p in (("discovery", discovery_port), ("learner", learner_port)) if p)
        with _reported(BrokerUnavailable, todo=START_THE_STACK):
            run_part(lambda: start_http_bridge(options), stop_http_bridge,
                     lambda _: console.print(f"HTTP bridge for {node_id} on http://{host}:{port}{extra} "
                                             f"({processes} process(es))"))
        return

    async def start_mqtt():
        from broker.connection import connect, credentials_from_env
        from broker.mqtt_bridge import MqttBridge

        nc = await connect(nats_url, "p2pfaas-mqtt-bridge")
        mqtt_creds = credentials_from_env("P2PFAAS_MQTT")
        mqtt_bridge = MqttBridge(nc, mqtt_url, prefix=prefix, client_id=client_id, max_payload_bytes=max_payload_bytes,
                                 credentials=mqtt_creds)
        await mqtt_bridge.start()
        return nc, mqtt_bridge

    async def stop_mqtt(part) -> None:
        from broker.connection import close_quietly

        nc, mqtt_bridge = part
        await mqtt_bridge.stop()
        await close_quietly(nc)

    with _reported(BrokerUnavailable, todo=START_THE_STACK):
        run_part(start_mqtt, stop_mqtt, lambda _: console.print(f"MQTT bridge {mqtt_url} <-> {nats_url}"))

def learner(
    node_ids: list[str] = typer.Option(["n1"], "--node", help="Node served (repeatable: one learner shared by several nodes)."),
    nats_url: Optional[str] = typer.Option(None, help="NATS to attach to (default: the one of the `p2pfaas up` running on --data-dir, as its operator)."),
    prefix: str = typer.Option("faas", help="Subject prefix."),
    data_dir: Path = typer.Option(Path("data"), help="Checkpoints go to DATA_DIR/nodes/<node>/learner/; the `p2pfaas up` running there names the default NATS."),
    scheduling_agent: str = typer.Option("dsarsa", help="Scheduling model: dsarsa (P2PFaaS) or dqn."),
    scaling_agent: str = typer.Option("dqn", help="Scaling model of each pool: dqn, pg, sarsa or dsarsa."),
    pools: list[str] = typer.Option(["default"], "--pool", help="Pool with a scaling model (repeatable: the nodes' pools); other model names are refused."),
    checkpoint_period: float = typer.Option(5.0, help="Seconds between checkpoints of changed models."),
    weights_period: float = typer.Option(1.0, help="Minimum seconds between two weights publications."),
    torch_threads: int = typer.Option(1, help="torch intra-op threads (small models are fastest on one)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the learner service of one or more nodes against an existing NATS (by default the one of
    the `p2pfaas up` running on --data-dir; docs/learner.md)."""
    from broker import handoff

    handoff.take()
    _logging(verbose)
    nats_url, _ = _attach(data_dir, nats_url)   # before torch's import: a missing stack is said at once

    import torch

    from nodes.learner.service import run_learner
    from nodes.learner.settings import LearnerSettings

    torch.set_num_threads(torch_threads)
    try:
        settings = LearnerSettings(node_ids=node_ids, nats_url=nats_url, prefix=prefix, data_dir=data_dir,
                                   scheduling_agent=scheduling_agent, scaling_agent=scaling_agent, pools=pools,
                                   checkpoint_period_s=checkpoint_period, weights_period_s=weights_period)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    async def main() -> None:
        stop = asyncio.Event()
        _stop_on_signal(stop)
        serving = asyncio.create_task(run_learner(settings, stop))
        console.print(f"learner for {', '.join(node_ids)} attached to {nats_url}; Ctrl-C to stop")
        await asyncio.wait({serving, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        await serving

    try:
        asyncio.run(main())
    except Exception as exc:  # broker unreachable, unusable data dir ... : one clear line
        _failed_with(exc)
