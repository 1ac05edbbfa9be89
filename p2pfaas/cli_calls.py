"""Using a running stack: ``p2pfaas invoke`` and ``p2pfaas top``."""

from __future__ import annotations

import asyncio
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from broker.errors import BrokerUnavailable
from p2pfaas.cli_common import (START_THE_STACK, _fail, _failed_with, _positive_seconds, _reported, _running_stack,
                                _stack_identity, _stack_nats_url, console)
from p2pfaas.cli_functions import DataDir, NatsUrl, Prefix


class Via(str, Enum):
    http = "http"
    mqtt = "mqtt"
    nats = "nats"

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
            outcome = asyncio.run(inv.via_nats(target, node_id, fn, payload, headers, timeout, client=client))
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
    """The HTTP bridge of ``node_id`` in the running stack; a node the stack does not have is an
    error, never another node's bridge answering as if asked."""
    http = _running_stack(data_dir, "--url").get("http", {})
    if node_id not in http:
        _fail(f"no HTTP endpoint for node {node_id} in {data_dir / 'endpoints.json'} "
              f"(known: {', '.join(http) or 'none'}): name one of them with --node, or give --url")
    return http[node_id]

def top(
    nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
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
