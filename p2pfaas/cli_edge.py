"""The commands of several machines (docs/edge.md): ``hub``, ``join``, ``auth invite``, ``auth revoke``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Optional

import typer

from broker.edge import LEAF_PORT
from broker.errors import BrokerUnavailable, DataDirInUse
from broker.messages import NodeConfiguration
from p2pfaas.cli_common import (MAX_PORT, STOP_TIMEOUT_S, MqttChoice, Runtime, _fail, _functions, _importable,
                                _logging, _reported, _sandbox, _stop_on_signal, _usable_data_dir, console,
                                serve_stack)

INVITATION_FILE = "invitation.json"   # under DATA_DIR/edge: what `join` was given, for its next start


def hub(
    data_dir: Path = typer.Option(Path("hub"), help="The hub's identities, certificates and logs."),
    host: str = typer.Option("0.0.0.0", help="Address the leaf listener binds (0.0.0.0: every interface)."),
    name: list[str] = typer.Option([], "--name", help="An address devices dial (IP or DNS name; repeatable): in the "
                                                      "hub's certificate and in invitations. Default: --host, or this "
                                                      "machine's addresses when it is 0.0.0.0."),
    leaf_port: int = typer.Option(LEAF_PORT, min=0, max=MAX_PORT, help="Port devices' leaf connections reach."),
    nats_port: int = typer.Option(4222, min=0, max=MAX_PORT, help="The operator's NATS port, on 127.0.0.1 (0: free)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO."),
) -> None:
    """Run a hub: the nats-server devices join as leaf nodes, over mutual TLS. Invite a device with
    `p2pfaas auth invite NAME`, remove one with `p2pfaas auth revoke NAME`; both apply at once."""
    from broker import handoff
    from p2pfaas.edge import Hub, HubSettings

    handoff.take()   # the hub holds every device's hub identity: not dumpable
    _logging(verbose)
    _usable_data_dir(data_dir)
    names = name or ([host] if host != "0.0.0.0" else _addresses())
    settings = HubSettings(data_dir=data_dir, host=host, names=names, leaf_port=leaf_port, nats_port=nats_port)

    async def main() -> None:
        stop = asyncio.Event()
        _stop_on_signal(stop)
        with console.status("starting the hub ..."):
            hub = Hub(settings)
            with _reported(ValueError, BrokerUnavailable, DataDirInUse, OSError):
                await hub.start()
        try:
            for note in hub.notes:
                console.print(f"[yellow]note:[/] {note}")
            console.print("[bold green]p2pfaas hub is up[/]")
            console.print(f"  leaf nodes  {', '.join(hub.leaf_urls)}  (mutual TLS, CA {hub.tls.ca})")
            console.print(f"  operator    {hub.server.url}  (`p2pfaas auth operator --data-dir {data_dir}`)")
            console.print(f"  invite:     p2pfaas auth invite NAME --data-dir {data_dir}   then on the device: "
                          "p2pfaas join NAME.invite")
            console.print(f"  logs in {data_dir / 'logs'}; Ctrl-C to stop")
            await stop.wait()
            console.print("stopping ...")
        finally:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await hub.stop()
        console.print("stopped")

    asyncio.run(main())


def _addresses() -> list[str]:
    """This machine's IPv4 addresses but loopback (what devices may dial)."""
    import socket

    found: list[str] = []
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            address = str(info[4][0])
            if not address.startswith("127.") and address not in found:
                found.append(address)
    except OSError:
        pass
    return found or ["127.0.0.1"]


def auth_invite(
    device: str = typer.Argument(..., help="The device's name: its node id (and its server's name) everywhere."),
    group: str = typer.Option("default", help="Its P2PFaaS group (fog network): it schedules with that group's nodes."),
    data_dir: Path = typer.Option(Path("hub"), help="The hub's data dir."),
    hub_url: list[str] = typer.Option([], "--hub-url", help=f"Where the device dials the hub (tls://HOST:{LEAF_PORT}; "
                                                            "repeatable); default: the running hub's addresses."),
    out: Optional[Path] = typer.Option(None, "--out", help="The invitation file (default DEVICE.invite here)."),
) -> None:
    """Invite a device machine: writes the file `p2pfaas join` takes (the hub's addresses and CA,
    the device's hub identity and client certificate: keep it secret). A running hub lets the
    device in before this returns."""
    from broker.auth import AuthStoreError
    from p2pfaas.edge import invite

    path = out or Path(f"{device}.invite")
    with _reported(ValueError, AuthStoreError, OSError, TimeoutError):
        invitation = invite(data_dir, device, group, hub_url)
        invitation.save(path)
    console.print(f"invitation for {device} (group {group}) in {path}: copy it to the device and run "
                  f"`p2pfaas join {path.name}` there")
    print(path)


def auth_revoke(
    device: str = typer.Argument(..., help="The device to remove from the deployment."),
    data_dir: Path = typer.Option(Path("hub"), help="The hub's data dir."),
) -> None:
    """Remove a device machine: its hub identity is forgotten and a running hub drops its link at
    once. Its peers stop seeing it within their removal time; it goes on serving its own callers."""
    from broker.auth import AuthStoreError
    from p2pfaas.edge import revoke

    with _reported(ValueError, AuthStoreError, OSError, TimeoutError):
        known = revoke(data_dir, device)
    if not known:
        _fail(f"{device} was not invited to the hub in {data_dir} (or is already revoked)")
    console.print(f"{device} revoked: it is off the hub")


def join(
    invitation: Optional[Path] = typer.Argument(None, help="The invitation file `p2pfaas auth invite` wrote (only the "
                                                           "first time: it is kept in DATA_DIR/edge)."),
    data_dir: Path = typer.Option(Path("data"), help="This device's streams, identities and logs."),
    host: Optional[str] = typer.Option(None, help="This machine's address: HTTP (P2PFaaS's ports) and MQTT listen "
                                                  "there, peers reach its node there. Default: the one towards the hub."),
    http_port: int = typer.Option(18080, min=1, max=MAX_PORT, help="The node's scheduler API (P2PFaaS: 18080)."),
    mqtt: MqttChoice = typer.Option(MqttChoice.nats, help="nats: nats-server's MQTT listener; mosquitto; off."),
    mqtt_port: int = typer.Option(1883, min=0, max=MAX_PORT, help="MQTT port for the devices next to it."),
    parallel: int = typer.Option(4, "--k", min=1, max=1024, help="K: parallel running functions."),
    queue: int = typer.Option(4, min=0, max=100_000, help="Queue length max."),
    runtime: Runtime = typer.Option(Runtime.process, help="Workers as OS processes or inside the node."),
    function: list[str] = typer.Option([], "--function", "-f", help="Add a function: name=package.module:callable."),
    controller: str = typer.Option("off", help="Autoscaled farm pool (function sleep) with this policy, or off."),
    p2pfaas_open: bool = typer.Option(False, "--p2pfaas-open", help="P2PFaaS's discovery (19000) and learner (19020) "
                                      "ports take changes without a token, as in P2PFaaS, whose clients carry none: "
                                      "a trusted network only."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO."),
) -> None:
    """Start this machine as a device of a hub: its own nats-server (a leaf of the hub, its
    streams its own), its node with workers, HTTP bridge, learner and discovery, and its MQTT
    listener. It keeps serving its callers when the hub or the link is down. Ctrl-C stops it."""
    from broker import handoff
    from broker.edge import Invitation
    from p2pfaas.edge import address_towards
    from p2pfaas.stack_settings import StackSettings

    handoff.take()   # a device's stack holds every identity of the device: not dumpable, none in its children's environment
    _logging(verbose)
    _usable_data_dir(data_dir)
    kept = data_dir / "edge" / INVITATION_FILE
    source = invitation or kept
    if not source.exists():
        _fail(f"no invitation: give the file `p2pfaas auth invite` wrote (none kept in {kept} yet)")
    with _reported(ValueError, OSError, todo="ask the hub's operator for a new one (`p2pfaas auth invite`)"):
        edge = Invitation.load(source)
        if invitation is not None:
            kept.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(kept.parent, 0o700)
            edge.save(kept)
    with _reported(ValueError):
        functions = _functions(function)
    sandbox = _sandbox(data_dir=data_dir, functions=functions) if runtime is Runtime.process else None
    _importable(functions, sandbox)
    settings = StackSettings(
        nodes=1, host=host or address_towards(edge.hubs[0]), http_port=http_port, nats_port=0, mqtt=mqtt.value,
        mqtt_port=mqtt_port, data_dir=data_dir, runtime=runtime.value, functions=functions, prefix=edge.prefix,
        configuration=NodeConfiguration(parallel_running_functions_max=parallel, queue_length_max=queue),
        controller_policy=None if controller == "off" else controller, models_dir=data_dir / "models", edge=edge,
        p2pfaas_open=p2pfaas_open)
    serve_stack(settings)


def compose_init(
    directory: Path = typer.Option(Path("."), "--dir", help="The checkout holding compose.yaml."),
    device: list[str] = typer.Option(["device"], "--device", help="An MQTT device of Mosquitto's listener (repeatable)."),
) -> None:
    """Make the identities of compose.yaml's services (compose/secrets, git-ignored) and the NATS
    servers' accounts (compose/nats/accounts.conf): run once before `docker compose up`; again to
    add devices (then restart mosquitto)."""
    from broker.auth import AuthStoreError, check_device_name
    from p2pfaas.compose_init import init

    if not (directory / "compose.yaml").is_file():
        _fail(f"{directory} holds no compose.yaml: give the checkout with --dir")
    for name in device:
        with _reported(ValueError):
            check_device_name(name)
    with _reported(AuthStoreError, OSError):
        secrets = init(directory, tuple(device))
    console.print(f"identities in {secrets} (env files, one per service) and {directory / 'compose/nats/accounts.conf'}")
    console.print(f"  devices' MQTT passwords: {secrets / 'mosquitto.env'}; the operator token: {secrets / 'http.env'}")
