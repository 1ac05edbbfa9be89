"""The ``p2pfaas`` command line: ``up``, ``node``, ``bridge``, ``invoke`` and the experiments."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from broker.errors import BrokerUnavailable
from broker.messages import NodeConfiguration
from controller.names import MODEL_SUFFIXES, PolicyNameError, canonical, known
from nodes.settings import DEFAULT_WORKER_IMAGE
from p2pfaas import cli_deadletters, cli_functions, cli_secrets
from p2pfaas.cli_common import (MAX_PORT, MqttChoice, Runtime, _fail, command_group, _failed_with, _functions,
                                _importable, _logging, _reported, _until_signal,
                                _usable_data_dir, console, serve_stack)

app = command_group("p2pfaas: peer-to-peer Function-as-a-Service over NATS/JetStream and MQTT.")
eval_app = command_group("Experiments: run the real system on seeded workloads and compare with references.")
app.add_typer(eval_app, name="eval")
ENROL_TIMEOUT_S = 20.0   # `auth device` waits this long for a running `up` to let the device in
START_THE_STACK = "is the stack running? Start it with `p2pfaas up`, or name a running NATS with --nats-url"
TURNED_AWAY_GIVE_UP_S = 1.0   # run by hand: a broker that refuses the first connect is asked for this long


class Via(str, Enum):
    http = "http"
    mqtt = "mqtt"
    nats = "nats"


def _policy_name(name: str, flag: str, *, off: bool = False) -> str:
    """The policy as the parts take it (a model file by its absolute path: they run elsewhere);
    a name no command knows is said before anything starts, with the nearest names."""
    try:
        name = canonical(name, off=off)
    except PolicyNameError as exc:
        _fail(f"{flag}: {exc}")
    return str(Path(name).resolve()) if name.endswith(MODEL_SUFFIXES) else name


@app.callback()
def _run_by_hand(ctx: typer.Context) -> None:
    # A command run by hand says at once that nothing listens at its NATS URL (nats-py retried for
    # 10 s); a part `up` started keeps retrying to its deadline, as its broker may be restarting.
    from broker import connection
    from broker.lifecycle import parent_pipe_watched

    if parent_pipe_watched():
        return
    before = connection.GIVE_UP_TURNED_AWAY_S
    connection.GIVE_UP_TURNED_AWAY_S = TURNED_AWAY_GIVE_UP_S
    ctx.call_on_close(lambda: setattr(connection, "GIVE_UP_TURNED_AWAY_S", before))   # a CliRunner's process


def _positive_seconds(value: Optional[float]) -> Optional[float]:
    """A duration that must be more than 0, refused as typer refuses a value out of range (typer
    has no open range: min=0 would let 0 through)."""
    if value is not None and value <= 0:
        raise typer.BadParameter(f"{value:g} is not more than 0 seconds")
    return value


def _running_stack(data_dir: Path, flag: str) -> dict:
    """The endpoints the ``up`` running on ``data_dir`` wrote; without them, ``flag`` is needed.
    Never a default URL: it reached whatever listened there (the machine's own NATS on 4222,
    another stack) and showed its state, or none, as if it were this stack's."""
    from p2pfaas.stack import read_endpoints

    known = read_endpoints(data_dir)
    if not known:
        _fail(f"no running `p2pfaas up` found in {data_dir} (no {data_dir / 'endpoints.json'}): "
              f"start one, or give {flag}")
    return known


def _stack_nats_url(data_dir: Path, nats_url: Optional[str]) -> str:
    return nats_url or _running_stack(data_dir, "--nats-url")["nats_url"]


def _attach(data_dir: Path, nats_url: Optional[str]):
    """The NATS a part (node, bridge, learner, controller) attaches to and the stack's identity
    store: ``nats_url``, else the one of the `up` running on ``data_dir`` (the default was
    nats://127.0.0.1:4222, the machine's shared broker, not the user's stack). Run by hand, a
    part acts as that stack's operator (:func:`_stack_identity`); one `up` started was given its
    URL and its own identity, and another data dir's files must not replace them."""
    from broker.lifecycle import parent_pipe_watched

    url = _stack_nats_url(data_dir, nats_url)
    return url, None if parent_pipe_watched() else _stack_identity(data_dir)


@app.command()
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
    from p2pfaas.stack import StackConfig, StackSettings

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
    if runtime is Runtime.process:   # a worker user that cannot run the workers, said before anything starts
        from nodes.sandbox import decide as decide_sandbox
        from nodes.settings import NodeSettings

        with _reported(ValueError):
            sandbox = decide_sandbox(NodeSettings(data_dir=data_dir, functions=functions, worker_user=worker_user,
                                                  worker_writable=worker_writable))
    _importable(functions, sandbox)
    if runtime is Runtime.docker:   # the engine and the workers' image, before anything starts
        from functions.image import check_engine

        with _reported(ValueError, todo="or use --runtime process"):
            check_engine(worker_image, build="p2pfaas image build")
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


@app.command()
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
    from p2pfaas.parts import HttpBridgeOptions, run_part, start_http_bridge, stop_http_bridge

    handoff.take()   # before anything starts a worker: its identities leave the environment workers inherit
    _logging(verbose)
    try:
        if settings_file is not None:
            settings = NodeSettings.model_validate_json(settings_file.read_bytes())
        else:
            settings = NodeSettings.from_env(
                node_id=node_id, nats_url=nats_url, seeds=seed or None, data_dir=data_dir, prefix=prefix,
                heartbeat_period_s=heartbeat_period, address=address, runtime=runtime.value,
                functions=_functions(function) or None, peer_scheduler_port=peer_scheduler_port,
                peer_discovery_port=peer_discovery_port, init_servers=init_server or None, node_rewards=node_rewards,
                worker_user=worker_user, docker_image=worker_image, docker_network=worker_network)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    store = None
    if settings_file is None:   # `up` checked its own before starting us (and named its NATS)
        sandbox = None
        if settings.runtime == "process":
            from nodes.sandbox import decide as decide_sandbox
            with _reported(ValueError):   # a worker user that cannot run the workers
                sandbox = decide_sandbox(settings)
        elif settings.runtime == "docker":   # the engine and the workers' image, before anything starts
            from functions.image import check_engine
            with _reported(ValueError, todo="or use --runtime process"):
                check_engine(settings.docker_image, build="p2pfaas image build --target worker")
        _importable(settings.functions, sandbox)
        url, store = _attach(settings.data_dir, nats_url or os.environ.get("P2PFAAS_NATS_URL"))
        settings = settings.model_copy(update={"nats_url": url})
        if store is not None and not handoff.get("P2PFAAS_SECRETS_KEY"):   # run by hand: as the stack's nodes
            handoff.hold(P2PFAAS_SECRETS_KEY=store.secrets_key())
    http = None
    if http_port is not None:
        if store is not None and not handoff.get("P2PFAAS_OPERATOR_TOKEN"):   # run by hand: as the stack's bridges
            handoff.hold(P2PFAAS_OPERATOR_TOKEN=store.operator_token())
        http = HttpBridgeOptions(node=settings.node_id, nats_url=settings.nats_url, host=http_host, port=http_port,
                                 prefix=settings.prefix, max_payload_bytes=settings.max_payload_bytes,
                                 processes=http_processes, discovery_port=discovery_port,
                                 learner_port=learner_port).read_env(in_node=True)

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
            return started, await start_http_bridge(http, door=started.scheduler.door)
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


@app.command()
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
    from p2pfaas.parts import HttpBridgeOptions, run_part, start_http_bridge, stop_http_bridge

    handoff.take()   # its identity and tokens: handed over by `up`, or exported by hand
    _logging(verbose)
    nats_url, store = _attach(data_dir, nats_url)
    if kind is BridgeKind.http:
        if store is not None and not handoff.get("P2PFAAS_OPERATOR_TOKEN"):   # run by hand: as the stack's bridges
            handoff.hold(P2PFAAS_OPERATOR_TOKEN=store.operator_token())        # (and our sibling processes) want it
        # secrets are handed over (`up` does) or exported, never on the command line
        options = HttpBridgeOptions(node=node_id, nats_url=nats_url, host=host, port=port, prefix=prefix,
                                    max_payload_bytes=max_payload_bytes, processes=processes,
                                    discovery_port=discovery_port, learner_port=learner_port).read_env()
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


@app.command()
def invoke(
    fn: str = typer.Argument(..., help="Function name, e.g. fib."),
    data: str = typer.Option("", "--data", "-d", help="Input payload (text); @FILE reads a file."),
    via: Via = typer.Option(Via.http, help="Transport."),
    node_id: str = typer.Option("n1", "--node", help="Target node."),
    url: Optional[str] = typer.Option(None, help="HTTP bridge URL (default: the --node's, from a running `p2pfaas up`)."),
    nats_url: Optional[str] = typer.Option(None, help="NATS URL (default: from a running `p2pfaas up`)."),
    mqtt_url: Optional[str] = typer.Option(None, help="MQTT URL (default: from a running `p2pfaas up`)."),
    header: list[str] = typer.Option([], "--header", "-H", help="Extra header 'Name: value' (http/nats)."),
    client: str = typer.Option("cli", help="Client id used in the result topic."),
    timeout: float = typer.Option(60.0, callback=_positive_seconds, help="Seconds to wait for the result (more than 0)."),
    data_dir: Path = typer.Option(Path("data"), help="Where `p2pfaas up` wrote endpoints.json."),
    show_headers: bool = typer.Option(False, "--show-headers", "-i", help="Print response headers/metadata."),
) -> None:
    """Invoke a function and print its output (exit code 1 on an error answer)."""
    from p2pfaas import invoke as inv

    with _reported(OSError, todo="--data @FILE sends the content of a file you may read"):
        payload = Path(data[1:]).read_bytes() if data.startswith("@") else data.encode()
    headers = {}
    for item in header:
        name, sep, value = item.partition(":")
        if not sep:
            raise typer.BadParameter(f"header {item!r} must look like 'Name: value'")
        headers[name.strip()] = value.strip()
    # where to, before anything is sent (and outside the try below, which would report our Exit)
    if via is Via.http:
        target = url or _http_endpoint(data_dir, node_id)
    elif via is Via.nats:
        target = _stack_nats_url(data_dir, nats_url)
    else:
        target = mqtt_url or _running_stack(data_dir, "--mqtt-url").get("mqtt_url") or _fail(
            f"the `p2pfaas up` in {data_dir} runs no MQTT (--mqtt off): give --mqtt-url")
    store = _stack_identity(data_dir)
    try:
        if via is Via.http:
            if store is not None and not any(k.lower() == "authorization" for k in headers):
                headers["Authorization"] = f"Bearer {store.operator_token()}"   # passes a required invoke token too
            outcome = inv.via_http(target, fn, payload, headers, timeout)
        elif via is Via.nats:
            outcome = inv.run_nats(target, node_id, fn, payload, headers, timeout, client=client)
        else:
            device = store.device(client) if store is not None else None   # `up` lets it in within a second
            outcome = inv.via_mqtt(target, node_id, fn, payload, timeout, client=client,
                                   password=device.password if device else None)
    except Exception as exc:  # connection refused, timeout ... : one clear line
        _failed_with(exc)
    if show_headers:
        console.print(f"status {outcome.status} in {outcome.elapsed_s * 1000:.1f} ms")
        for k, v in outcome.headers.items():
            console.print(f"  {k}: {v}")
    sys.stdout.buffer.write(outcome.body + (b"\n" if not outcome.body.endswith(b"\n") else b""))
    if outcome.status >= 300:
        console.print(f"[red]status {outcome.status}[/]")
        raise typer.Exit(1)


def _http_endpoint(data_dir: Path, node_id: str) -> str:
    """The HTTP bridge of ``node_id`` in the running stack: a node it does not have is said (it
    used to be n1's bridge, which answered as if asked)."""
    http = _running_stack(data_dir, "--url").get("http", {})
    if node_id not in http:
        _fail(f"no HTTP endpoint for node {node_id} in {data_dir / 'endpoints.json'} "
              f"(known: {', '.join(http) or 'none'}): name one of them with --node, or give --url")
    return http[node_id]


def _stack_store(data_dir: Path, required: bool = False):
    """The identity store `up` made in ``data_dir``; None when there is none (no stack was set
    up there, or an --insecure one), unless ``required``: then that is said, exit code 2."""
    from broker.auth import AuthStore

    directory = data_dir / "auth"
    if (directory / "services.json").exists():
        return AuthStore(directory)
    if required:   # a store made here would hold identities no running stack accepts
        _fail(f"no stack has been set up in {data_dir} (no identities in {directory}): run `p2pfaas up "
              f"--data-dir {data_dir}` first (an --insecure stack has none)")
    return None


def _stack_identity(data_dir: Path):
    """The identity store of the `up` stack in ``data_dir`` (None when it has none); tools run by
    hand act as its operator on NATS (parts started by `up` already have their own identity)."""
    from broker import handoff
    from broker.auth import OPERATOR, AuthStoreError

    store = _stack_store(data_dir)
    if store is None:
        return None
    ca = data_dir / "tls" / "ca.pem"
    if ca.exists() and not os.environ.get("P2PFAAS_TLS_CA"):
        os.environ["P2PFAAS_TLS_CA"] = str(ca)
    if not handoff.get("P2PFAAS_NATS_USER"):
        with _reported(AuthStoreError, OSError):
            operator = store.service(OPERATOR)
        handoff.hold(P2PFAAS_NATS_USER=operator.user, P2PFAAS_NATS_PASSWORD=operator.password)
    return store


def _with_progress_bars(run, width: int, total: int | None = None):
    """Run an experiment coroutine ``run(advance)`` with one progress bar per phase."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from p2pfaas.progress import WorkProgress

    progress = WorkProgress(TextColumn(f"{{task.description:<{width}}}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console)
    bars: dict[str, int] = {}

    def advance(name: str, done: int, phase_total: int) -> None:
        if name not in bars:
            bars[name] = progress.add_task(name, total=total or phase_total)
        progress.update(bars[name], completed=done)

    with progress:
        return asyncio.run(run(advance))


def _print_report(title: str, experiment, report, json_out: Optional[Path], width: int) -> None:
    """The experiment's table (its HEADERS, rows() and caption()) and, if asked, its JSON."""
    from rich.table import Table

    table = Table(title=title, caption=experiment.caption(report))
    for i, header in enumerate(experiment.HEADERS):
        table.add_column(header, no_wrap=True, justify="left" if i == 0 else "right")
    for row in experiment.rows(report):
        table.add_row(*row)
    out = Console()
    if not out.is_terminal:  # piped into a file: do not squeeze the table into 80 columns
        out = Console(width=width)
    out.print(table)
    if json_out:
        json_out.write_bytes(report.to_json())
        console.print(f"report written to {json_out}")


@eval_app.command("p2p")
def eval_p2p(
    nodes: int = typer.Option(4, "--nodes", min=2, max=16, help="n: number of nodes."),
    slots: int = typer.Option(3, "--k", min=1, max=64, help="K: slots per node (the queue is disabled)."),
    service: float = typer.Option(0.2, "--service", min=0.001, help="Mean exponential service time, seconds."),
    hot_load: float = typer.Option(3.0, "--hot-load", min=0.0, help="Erlangs offered to the hot node n1."),
    cold_load: float = typer.Option(1.0, "--cold-load", min=0.0, help="Erlangs offered to every other node."),
    duration: float = typer.Option(60.0, "--duration", min=1.0, help="Seconds of arrivals per algorithm."),
    seed: int = typer.Option(1, "--seed", help="Seed of the arrivals and service times."),
    algorithm: list[str] = typer.Option([], "--algorithm", "-a",
                                        help="Name or Name:p1,p2,... (repeatable; default: NoScheduler, ForwardScheduler, 3 PowerOfN variants, RoundRobin)."),
    nats_url: Optional[str] = typer.Option(None, help="Run against this NATS (default: a private nats-server)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report here."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """P2P scheduling vs the Erlang-B bounds: rejection rate and latency per algorithm, one hot node."""
    from p2pfaas.experiments import p2p

    _logging(verbose)
    exp = p2p.P2PExperiment(nodes=nodes, slots=slots, mean_service_s=service, hot_load=hot_load,
                            cold_load=cold_load, duration_s=duration, seed=seed)
    if algorithm:
        with _reported(ValueError):
            exp.algorithms = [p2p.parse_algorithm(a) for a in algorithm]
    total = len(p2p.poisson_arrivals(exp))
    with _reported(BrokerUnavailable, todo="check --nats-url (without it a private nats-server is started)"):
        report = _with_progress_bars(lambda advance: p2p.run_experiment(exp, nats_url=nats_url, progress=advance),
                                     width=40, total=total)
    _print_report("p2pfaas eval p2p", p2p, report, json_out, width=140)


@eval_app.command("learning")
def eval_learning(
    duration: float = typer.Option(60.0, "--duration", min=1.0, help="Seconds of arrivals per measured algorithm."),
    warmup: float = typer.Option(180.0, "--warmup", min=0.0, help="Seconds of arrivals of the LearningScheduler's online warm-up."),
    seed: int = typer.Option(1, "--seed", help="Seed of the arrivals, task types and service times."),
    power_of_n: list[str] = typer.Option([], "--power-of-n", help="PowerOfN parameters F,T,loss,maxHops to compare (repeatable; default: three settings)."),
    greedy: bool = typer.Option(False, "--greedy", help="Measure the learned policy greedy (default: still exploring, as deployed)."),
    nats_url: Optional[str] = typer.Option(None, help="Run against this NATS (default: a private nats-server)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report here."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """LearningScheduler vs NoScheduler and PowerOfN: deadlines met on heterogeneous nodes (docs/learning.md)."""
    from p2pfaas.experiments import learning

    _logging(verbose)
    exp = learning.LearningExperiment(duration_s=duration, warmup_s=warmup, seed=seed, explore=not greedy)
    if power_of_n:
        exp.power_of_n = [[p.strip() for p in spec.split(",")] for spec in power_of_n]
    with _reported(BrokerUnavailable, todo="check --nats-url (without it a private nats-server is started)"):
        report = _with_progress_bars(lambda advance: learning.run_experiment(exp, nats_url=nats_url, progress=advance),
                                     width=44)
    _print_report("p2pfaas eval learning", learning, report, json_out, width=160)


@app.command()
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
        serving = asyncio.create_task(run_learner(settings, stop))
        console.print(f"learner for {', '.join(node_ids)} attached to {nats_url}; Ctrl-C to stop")
        await asyncio.wait({serving, asyncio.create_task(_until_signal(stop))}, return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        await serving

    try:
        asyncio.run(main())
    except Exception as exc:  # broker unreachable, unusable data dir ... : one clear line
        _failed_with(exc)


# -- identities (docs/security.md) ---------------------------------------------------
auth_app = command_group("Identities of an `up` stack (devices, the operator token) and of a hub (invitations).")
app.add_typer(auth_app, name="auth")


@auth_app.command("device")
def auth_device(
    name: str = typer.Argument(..., help="Device name: its MQTT user and the <client> token of its topics."),
    data_dir: Path = typer.Option(Path("data"), help="The stack's data dir (its identities are in DATA_DIR/auth)."),
) -> None:
    """Create (or show) a device identity; prints {"user": ..., "password": ...}. With `up` running
    (or starting) on DATA_DIR, it returns once the brokers let the device in."""
    from broker.auth import AuthStoreError, check_device_name
    from broker.lifecycle import data_dir_held

    try:
        check_device_name(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME") from None
    store = _stack_store(data_dir, required=True)
    with _reported(AuthStoreError, OSError):
        credentials = store.device(name)
        changed = store.changed_at()
    deadline = time.monotonic() + ENROL_TIMEOUT_S
    while data_dir_held(data_dir) and store.applied_at() < changed:
        if time.monotonic() > deadline:
            console.print(f"[red]error:[/] device {name} is created, but the running `up` on {data_dir} has not let it "
                          f"in within {ENROL_TIMEOUT_S:g} s: its console and {data_dir / 'logs'} say why")
            raise typer.Exit(1)
        time.sleep(0.05)
    print(credentials.as_json())


@auth_app.command("operator")
def auth_operator(
    data_dir: Path = typer.Option(Path("data"), help="The stack's data dir (its identities are in DATA_DIR/auth)."),
) -> None:
    """Print the operator token: `Authorization: Bearer <token>` on routes that change state."""
    from broker.auth import AuthStoreError

    store = _stack_store(data_dir, required=True)
    with _reported(AuthStoreError, OSError):
        print(store.operator_token())


# -- autoscaling ------------------------------------------------------------------
train_app = command_group("Train models (saved under data/models by default).")
app.add_typer(train_app, name="train")
farm_app = command_group("The farm: emit a scenario's tasks into a node.")
app.add_typer(farm_app, name="farm")


def _mount_scaling_commands() -> None:
    from controller.commands import eval_scaling, trace_sample, train_scaling

    eval_app.command("scaling")(eval_scaling)
    eval_app.command("trace-sample")(trace_sample)
    train_app.command("scaling")(train_scaling)


_mount_scaling_commands()


@train_app.command("scheduling")
def train_scheduling(
    duration: float = typer.Option(600.0, "--duration", min=10.0, help="Simulated seconds of arrivals to train on."),
    seed: int = typer.Option(7, "--seed", help="Seed of the simulated arrivals and of the agents."),
    node_id: str = typer.Option("n1", "--node", help="Whose table to keep (the hot node decides most)."),
    out: Optional[Path] = typer.Option(None, help="Model file (.npz) to write (default data/models/scheduling-dsarsa.npz)."),
    ship: bool = typer.Option(False, help="Write the package's shipped model nodes/learner/shipped/scheduling-dsarsa.npz (maintainers)."),
) -> None:
    """Train the LearningScheduler's table on a seeded simulation of `eval learning`'s nodes (seconds,
    deterministic) and save it with a JSON sidecar; learners start new scheduling models from it."""
    import shlex

    import orjson

    from nodes.learner.algorithms.portable import save_portable
    from nodes.learner.settings import SHIPPED_SCHEDULING_MODEL
    from p2pfaas.experiments.learning import LearningExperiment
    from p2pfaas.experiments.learning_sim import measure_greedy, train_scheduling_tables

    exp = LearningExperiment()
    if node_id not in {n.node_id for n in exp.nodes}:
        raise typer.BadParameter(f"no node {node_id!r} in the experiment", param_hint="--node")
    from p2pfaas.progress import WorkProgress

    with WorkProgress(console=console) as progress:
        bar = progress.add_task(f"simulating {duration:g} s", total=1)
        agents = train_scheduling_tables(
            exp, duration, seed, progress=lambda done, total: progress.update(bar, completed=done, total=total))
    own = measure_greedy(exp, agents, seed + 1)                                    # each node its own table
    shared = measure_greedy(exp, {n.node_id: agents[node_id] for n in exp.nodes}, seed + 1)   # all this one
    path = SHIPPED_SCHEDULING_MODEL if ship else (out or Path("data/models/scheduling-dsarsa.npz"))
    metadata = {
        "purpose": "scheduling", "algorithm": "dsarsa", "node": node_id, "seed": seed, "duration_s": duration,
        "command": "p2pfaas " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "state": "[task type, free slots here, free slots of peer 0, peer 1] (0/1/2+)",
        "simulated_deadline_met_each_node_its_table": round(own.met_rate, 4),
        "simulated_deadline_met_all_nodes_this_table": round(shared.met_rate, 4),
        "simulated_rejected_all_nodes_this_table": round(shared.rejected / max(1, shared.requests), 4),
    }
    save_portable(path, agents[node_id], metadata)
    path.with_suffix(".json").write_bytes(orjson.dumps(metadata, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    console.print(f"model: {path}: {len(agents[node_id].q)} states. Simulated, greedy: every node with its own "
                  f"table meets {100 * own.met_rate:.1f} % of deadlines, every node with {node_id}'s "
                  f"{100 * shared.met_rate:.1f} % ({100 * shared.rejected / max(1, shared.requests):.1f} % rejected)")


@app.command("controller")
def controller_cmd(
    node_id: str = typer.Option("n1", "--node", help="Node of the pool."),
    pool: str = typer.Option("farm", help="Pool to scale (the `up` stack's farm pool is 'farm'; 'default' scales K)."),
    policy: str = typer.Option("auto", help=f"auto (the shipped RL model), or {known(auto=False)}."),
    learn_online: bool = typer.Option(True, help="RL policies: seed the node's learner, use its online-trained weights, roll back to the shipped ones if live QoS drops."),
    scenario: str = typer.Option("bursty", help="Scenario giving worker bounds and observation normalisation."),
    panic: Optional[bool] = typer.Option(None, "--panic/--no-panic", help="Raise the target between decisions when the load outgrows the pool (Knative's panic mode; default: for RL policies, which are trained with it)."),
    functions: bool = typer.Option(False, "--functions/--no-functions", help="Also scale every function that has a pool of its own, on every node, with its deployment's policy (`up` does)."),
    models_dir: Path = typer.Option(Path("data/models"), help="Where trained scaling models are looked up."),
    nats_url: Optional[str] = typer.Option(None, help="NATS URL (default: from a running `p2pfaas up`)."),
    data_dir: Path = typer.Option(Path("data"), help="Where `p2pfaas up` wrote endpoints.json."),
    prefix: str = typer.Option("faas", help="Subject prefix."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO."),
) -> None:
    """Scale a pool live: telemetry in, scale commands and learning experiences out (Ctrl-C stops)."""
    from broker.connection import close_quietly, connect
    from controller.live import LiveController
    from controller.policies import resolve_policy
    from controller.scenario import ScenarioError, load_scenario
    from broker import handoff
    from p2pfaas.parts import run_part

    handoff.take()
    _logging(verbose)
    _policy_name(policy, "--policy")
    with _reported(ScenarioError):
        sc = load_scenario(scenario)
    with _reported(ValueError, todo="see --policy in --help"):
        chosen, name, note = resolve_policy(policy, sc, models_dir)
    url, _ = _attach(data_dir, nats_url)

    def show(step) -> None:
        t = step.telemetry
        console.print(f"{time.strftime('%H:%M:%S')} arrivals {t.arrival_rate:6.2f}/s  queue {t.queue_length:4d}  "
                      f"workers {t.workers_ready:3d}+{t.workers_starting:<2d} -> target {step.target:3d}  QoS {t.qos:6.1%}"
                      + (f"  model {step.model_version}" if step.model_version else ""))

    def panicked(pulse, previous: int, target: int) -> None:
        console.print(f"{time.strftime('%H:%M:%S')} panic: {pulse.arrivals} arrivals in {pulse.window_s:.1f} s, "
                      f"queue {pulse.queue_length}, workers {pulse.workers_ready}+{pulse.workers_starting} "
                      f"-> target {previous} -> {target}")

    def scaling_function(controller) -> None:
        console.print(f"{time.strftime('%H:%M:%S')} function {controller.pool} on {controller.node}: "
                      f"scaled by {controller.policy_name}")

    async def start():
        nc = await connect(url, f"controller-{node_id}-{pool}")
        controller = LiveController(nc, node_id, pool, chosen, sc, prefix=prefix, policy_name=name, on_step=show,
                                    on_panic=panicked, learn_online=learn_online, models_dir=models_dir,
                                    react_between_periods=panic)
        await controller.start()
        scaler = None
        if functions:
            from controller.functions import FunctionScaler
            scaler = await FunctionScaler(nc, sc, prefix=prefix, models_dir=models_dir, learn_online=learn_online,
                                          on_start=scaling_function).start()
        return nc, controller, scaler

    async def stop(part) -> None:
        nc, controller, scaler = part
        if scaler is not None:
            await scaler.stop()
        await controller.stop()
        await close_quietly(nc)

    def announce(part) -> None:
        if note:
            console.print(f"[yellow]note:[/] {note}")
        if part[1].learner_note:
            console.print(f"[yellow]note:[/] {part[1].learner_note}")
        console.print(f"controlling {node_id}/{pool} with {name}"
                      f"{', raising between decisions when the load outgrows the pool' if part[1].reacts else ''}"
                      f"{', and every function with a pool of its own' if part[2] is not None else ''}; Ctrl-C to stop")

    with _reported(BrokerUnavailable, todo=START_THE_STACK):
        run_part(start, stop, announce)


@farm_app.command("run")
def farm_run(
    scenario: str = typer.Option("bursty", help="Shipped scenario name or a scenario file."),
    node_id: str = typer.Option("n1", "--node", help="Node to send the tasks to."),
    pool: str = typer.Option("farm", help="The pool that runs them (the `up` stack's autoscaled pool is 'farm'): its worker-seconds are measured."),
    seed: int = typer.Option(0, help="Seed of the arrivals and service times."),
    speed: float = typer.Option(1.0, min=0.1, max=100.0, help="Time compression: >1 runs faster (rates x speed, service and deadlines / speed). The pool's control period and cold starts are not compressed, so QoS is comparable with the simulator only at 1."),
    fn: str = typer.Option("sleep", help="Function that plays a task (its payload is the service time)."),
    nats_url: Optional[str] = typer.Option(None, help="NATS URL (default: from a running `p2pfaas up`)."),
    data_dir: Path = typer.Option(Path("data"), help="Where `p2pfaas up` wrote endpoints.json."),
    prefix: str = typer.Option("faas", help="Subject prefix."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the QoS and the pool's figures here."),
) -> None:
    """Emit a scenario's tasks (Poisson arrivals, sampled service times, deadlines); report QoS and
    what the pool spent (worker-seconds, mean/max workers, scaling actions, deciding models)."""
    import orjson

    from broker.connection import close_quietly, connect
    from controller.emitter import POOL_FIGURES, FarmEmitter, PoolMeter
    from p2pfaas.progress import WorkProgress
    from controller.scenario import ScenarioError, load_scenario

    with _reported(ScenarioError):
        sc = load_scenario(scenario)
    url = _stack_nats_url(data_dir, nats_url)
    _stack_identity(data_dir)

    running: dict = {}   # what a Ctrl-C leaves to report: the emitter's figures and the meter's

    async def main():
        nc = await connect(url, "farm-emitter")
        try:
            emitter = running["emitter"] = FarmEmitter(nc, node_id, sc, seed=seed, prefix=prefix, fn=fn, speed=speed)
            async with PoolMeter(nc, node_id, pool, prefix=prefix) as meter:
                running["meter"] = meter
                with WorkProgress(console=console) as progress:
                    bar = progress.add_task(f"{sc.name} -> {node_id}", total=1.0)

                    def update(fraction, report):
                        progress.update(bar, completed=fraction,
                                        description=f"{sc.name} -> {node_id}: {report.submitted} sent, {report.completed} done")
                    await emitter.run(update)
                    progress.update(bar, completed=1.0)
        finally:
            await close_quietly(nc)

    with _reported(BrokerUnavailable, todo=START_THE_STACK):
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            if "meter" not in running:   # nothing sent yet
                raise typer.Exit(130)
            running["emitter"].report.interrupted = True   # (also when it came as the run was ending)
    report, meter = running["emitter"].report, running["meter"]
    if report.interrupted:
        console.print(f"[yellow]interrupted{f' ({report.stopped_because})' if report.stopped_because else ''}:[/] "
                      "the figures cover the run so far; tasks without an answer yet are not counted "
                      "(those stored still run on the pool)")
    console.print(f"tasks {report.submitted}, completed {report.completed}, errors {report.errors}, "
                  f"unfinished {report.unfinished}, lost {report.lost}, "
                  f"QoS {f'{report.qos:.2%}' if report.settled else '-'}, "
                  f"p95 latency {report.p95_s:.2f} s")
    totals = meter.totals()
    if totals is not None:
        console.print(f"pool {node_id}/{pool}: {totals.worker_seconds:.0f} worker-s over {totals.duration_s:.0f} s, "
                      f"mean {totals.mean_workers:.2f} / max {totals.max_workers} workers, "
                      f"{totals.scaling_actions} scaling actions; decided by "
                      + ", ".join(f"{k} ({n})" for k, n in meter.policies.items()))
    else:
        console.print(f"[yellow]no telemetry of pool {node_id}/{pool} seen: worker-seconds unknown[/]")
    if json_out is not None:
        json_out.write_bytes(orjson.dumps({
            "scenario": sc.name, "seed": seed, "speed": speed, "tasks": report.submitted, "completed": report.completed,
            "errors": report.errors, "unfinished": report.unfinished, "lost": report.lost, "qos": report.qos,
            "p95_s": report.p95_s, "interrupted": report.interrupted, "stopped_because": report.stopped_because,
            "pool": totals.model_dump(include=POOL_FIGURES) if totals else None, "decided_by": meter.policies,
        }, option=orjson.OPT_INDENT_2))
    if report.interrupted and not report.stopped_because:   # Ctrl-C
        raise typer.Exit(130)
    if report.lost or report.errors or report.unfinished:
        raise typer.Exit(1)


@app.command()
def top(
    nats_url: Optional[str] = typer.Option(None, help="NATS URL (default: from a running `p2pfaas up`)."),
    data_dir: Path = typer.Option(Path("data"), help="Where `p2pfaas up` wrote endpoints.json."),
    prefix: str = typer.Option("faas", help="Subject prefix."),
    once: Optional[float] = typer.Option(None, callback=_positive_seconds, help="Watch this many seconds, print one snapshot and exit (2 or more shows every pool: one with a long control period sends a pulse every 2 s)."),
    interval: float = typer.Option(1.0, callback=_positive_seconds, help="Seconds between refreshes; when stdout is not a terminal (a file, a pipe), a plain snapshot is printed each time."),
) -> None:
    """Live view of nodes (load, K, queue) and pools (workers, queue, latency, QoS); into a file or
    a pipe, timestamped snapshots instead."""
    from p2pfaas.top import watch

    url = _stack_nats_url(data_dir, nats_url)
    _stack_identity(data_dir)
    out = Console()   # a file or a pipe gets 80 columns, which every table fits
    with _reported(BrokerUnavailable, todo=START_THE_STACK):
        if once is not None:
            view = asyncio.run(watch(url, prefix, duration_s=once, live=False))
            out.print(view.render())
            return
        try:
            asyncio.run(watch(url, prefix, refresh_s=interval, out=out))
        except KeyboardInterrupt:
            pass


# -- container images ----------------------------------------------------------------
image_app = command_group("Container images built from this repository (docs/containers.md).")
app.add_typer(image_app, name="image")


class ImageTarget(str, Enum):
    worker = "worker"
    node = "node"
    function = "function"


@image_app.command("build")
def image_build(
    target: ImageTarget = typer.Option(ImageTarget.worker, help="worker: `--runtime docker` workers (small, no torch); node: every role (compose); function: the example function image (wordcount)."),
    base: str = typer.Option("python:3.11-slim", help="Base image (python3 3.11+ with venv), e.g. a local Debian image when no registry is reachable."),
    ca_bundle: Optional[Path] = typer.Option(None, help="CA bundle pip trusts inside the build (default: PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE when set)."),
    torch_wheel: Optional[Path] = typer.Option(None, help="torch 2.13.0 CPU wheel for the node image (default: one in pip's find-links, else PyTorch's CPU index)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every build line."),
) -> None:
    """Build an image on the Docker engine DOCKER_HOST names; prints its reference (also tagged :latest)."""
    import docker
    from docker.errors import DockerException

    from p2pfaas import images

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except DockerException as exc:
        console.print(f"[red]error:[/] no Docker engine at {os.environ.get('DOCKER_HOST', 'the default socket')}: {exc}")
        raise typer.Exit(2)
    for path, flag in ((ca_bundle, "--ca-bundle"), (torch_wheel, "--torch-wheel")):
        if path is not None and not path.is_file():
            raise typer.BadParameter(f"{path} is not a file", param_hint=flag)
    options = images.BuildOptions(base=base, ca_bundle=ca_bundle or images.pip_ca_bundle())
    if target is ImageTarget.node:
        wheel = torch_wheel or images.local_torch_wheel()
        options.wheels = [wheel] if wheel else []
        console.print(f"torch: {wheel or 'from PyTorch CPU index (no local wheel found)'}")
    with console.status(f"building {target.value} image on {base} ...") as status:
        def progress(line: str) -> None:
            if verbose:
                console.print(line, markup=False, highlight=False)
            elif line.startswith("Step "):
                status.update(f"building {target.value} image: {line[:100]}")
        try:
            if target is ImageTarget.function:
                ref = images.build_function_image(client, base=base, progress=progress)
            else:
                ref = images.build_image(client, target.value, options, progress=progress)
        except (images.ImageBuildError, ValueError, DockerException) as exc:
            console.print(f"[red]build failed:[/] {exc}")
            raise typer.Exit(1)
    console.print(f"[green]built[/] {ref}")
    print(ref)


def _mount_edge_commands() -> None:
    from p2pfaas import cli_edge

    app.command("hub")(cli_edge.hub)
    app.command("join")(cli_edge.join)
    auth_app.command("invite")(cli_edge.auth_invite)
    auth_app.command("revoke")(cli_edge.auth_revoke)
    compose_app = command_group("compose.yaml's deployment: its identities.")
    compose_app.command("init")(cli_edge.compose_init)
    app.add_typer(compose_app, name="compose")


_mount_edge_commands()
app.add_typer(cli_deadletters.app, name="dead-letters")
app.add_typer(cli_secrets.app, name="secret")
for _name, _command in (("deploy", cli_functions.deploy), ("list", cli_functions.list_functions),
                        ("describe", cli_functions.describe), ("remove", cli_functions.remove),
                        ("logs", cli_functions.logs)):
    app.command(_name)(_command)

# What `--help` lists for each command and group: whole in 80 columns (click cuts a longer first
# sentence with "..."); the docstrings say the rest. A command without one fails tests/p2pfaas/test_help.py.
SUMMARIES = {
    "up": "Start the whole stack: broker, nodes, controller.",
    "node": "Run one node against a running NATS.",
    "bridge": "Run one bridge (HTTP, MQTT) against a running NATS.",
    "invoke": "Invoke a function and print its output.",
    "learner": "Run the learner of one or more nodes.",
    "controller": "Scale a pool live with a policy.",
    "top": "Live view of nodes, pools and who scales them.",
    "hub": "Run a hub that devices join as leaf nodes.",
    "join": "Start this machine as a device of a hub.",
    "eval": "Experiments against references.",
    "eval p2p": "P2P scheduling vs the Erlang-B bounds.",
    "eval learning": "LearningScheduler vs NoScheduler and PowerOfN.",
    "eval scaling": "Every scaling policy on the same seeded episodes.",
    "eval trace-sample": "Write a generated day in the Azure 2019 trace format.",
    "auth": "Identities of a stack and of a hub.",
    "auth device": "Create (or show) a device identity.",
    "auth operator": "Print the operator token.",
    "auth invite": "Invite a device machine to the hub.",
    "auth revoke": "Remove a device machine from the hub.",
    "train": "Train models.",
    "train scaling": "Train an RL scaling agent on the simulated farm.",
    "train scheduling": "Train the LearningScheduler's table.",
    "farm": "Run a scenario's tasks live.",
    "farm run": "Emit a scenario's tasks into a node; report QoS.",
    "image": "Container images built from this repository.",
    "image build": "Build an image on the Docker engine.",
    "compose": "compose.yaml's deployment.",
    "compose init": "Make the identities of compose.yaml's services.",
    "deploy": "Deploy a function on every node (or a stack file's).",
    "list": "The deployment's functions.",
    "describe": "One function: reference, environment, labels.",
    "remove": "Remove a function from every node.",
    "logs": "What a function printed, on every node.",
    "dead-letters": "List, show and redrive dead-lettered tasks.",
    "dead-letters list": "The dead letters, oldest first.",
    "dead-letters show": "One dead letter, its headers and payload.",
    "dead-letters redrive": "Store dead letters again in a node's intake.",
    "secret": "The deployment's secrets (sealed; names only shown).",
    "secret create": "Create a secret.",
    "secret update": "Change a secret's value.",
    "secret list": "The secrets' names.",
    "secret remove": "Remove a secret no function uses.",
}


def _summarise(group: typer.Typer, path: tuple[str, ...] = ()) -> None:
    for command in group.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        command.short_help = SUMMARIES.get(" ".join((*path, name)), command.short_help)
    for sub in group.registered_groups:
        sub.short_help = SUMMARIES.get(" ".join((*path, sub.name)), sub.short_help)
        _summarise(sub.typer_instance, (*path, sub.name))


_summarise(app)


if __name__ == "__main__":
    app()
