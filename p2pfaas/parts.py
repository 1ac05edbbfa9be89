"""One part of the system as a process of its own (``p2pfaas node``, ``bridge``): announced with a
``READY`` line on stdout, stopped on SIGINT/SIGTERM or when its parent ends, within a deadline."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Annotated, Any, Awaitable, Callable

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from broker import handoff
from broker.connection import credentials_from_env
from broker.embedded import die_with_parent_preexec
from broker.http.limits import HttpLimits
from nodes.settings import comma_separated
from broker.lifecycle import child_env, hard_exit_after, on_parent_gone, parent_gone, parent_pipe_watched, run_loop

if TYPE_CHECKING:
    from broker.client import InProcessDoor

STOP_TIMEOUT_S = 60.0
ORPHAN_STOP_S = 5.0   # our parent is gone (killed): nobody waits for a graceful stop


def run_part(start: Callable[[], Awaitable[Any]], stop: Callable[[Any], Awaitable[None]],
             announce: Callable[[Any], None], stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Start the part, print READY, serve until asked to stop (or orphaned), stop within the deadline."""

    async def main() -> None:
        part = await start()
        print("READY", flush=True)
        announce(part)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def parent_ended() -> None:
            hard_exit_after(ORPHAN_STOP_S, code=1)   # nobody waits for us: the short deadline, whatever came first
            done.set()

        def on_signal() -> None:   # the parent-death signal may come before our pipe's end of file
            if parent_pipe_watched() and parent_gone():
                return parent_ended()
            done.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        on_parent_gone(parent_ended)
        await done.wait()
        hard_exit_after(stop_timeout_s, code=1)   # a stop that hangs must not keep the process
        await stop(part)

    run_loop(main())


# -- the HTTP bridge, possibly as several processes on one port ----------------------------------
BRIDGE_NATS_ENV = "P2PFAAS_BRIDGE_NATS"   # the bridge's NATS identity inside a node's process (USER, PASSWORD)


class HttpBridgeSettings(BaseSettings):
    """One bridge process's settings: what is not given explicitly comes from ``P2PFAAS_<FIELD>``
    (``P2PFAAS_CALLBACK_HOSTS`` comma-separated, ``P2PFAAS_HTTP_LIMITS`` JSON or
    ``P2PFAAS_HTTP_LIMITS__<FIELD>``). ``up`` hands the tokens over: :meth:`with_secrets`."""

    model_config = SettingsConfigDict(env_prefix="P2PFAAS_", env_ignore_empty=True, extra="ignore",
                                      env_nested_delimiter="__")

    node: str
    nats_url: str
    host: str = "127.0.0.1"
    port: int = Field(default=18080, ge=0, le=65535)
    prefix: str = "faas"
    max_payload_bytes: int = Field(default=1024 * 1024, ge=1)
    processes: int = Field(default=1, ge=1)
    callback_hosts: Annotated[tuple[str, ...], NoDecode] = ()   # the hosts X-Callback-Url may name
    tls_cert: str = ""                   # with tls_key: HTTPS only
    tls_key: str = ""
    p2pfaas_open: bool = False           # P2PFaaS's discovery/learner ports take changes without a token
    discovery_port: int | None = None    # P2PFaaS's discovery API (19000) by this process too
    learner_port: int | None = None      # P2PFaaS's learner API (19020)
    http_limits: HttpLimits = HttpLimits()
    # handed over (docs/security.md); never dumped nor shown
    operator_token: str | None = Field(default=None, exclude=True, repr=False)
    invoke_token: str | None = Field(default=None, exclude=True, repr=False)
    # None: the process's own (P2PFAAS_NATS_USER/PASSWORD)
    nats_credentials: tuple[str, str] | None = Field(default=None, exclude=True, repr=False)

    @field_validator("callback_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        return comma_separated(value)

    @property
    def tls(self) -> tuple[str, str] | None:
        return (self.tls_cert, self.tls_key) if self.tls_cert else None

    def with_secrets(self, *, in_node: bool = False) -> "HttpBridgeSettings":
        """These settings with the tokens handed over and, inside a node's process (``in_node``), the
        bridge's own NATS identity; there the TLS key's path then leaves the environment workers inherit."""
        if in_node:
            os.environ.pop("P2PFAAS_TLS_KEY", None)
        return self.model_copy(update={
            "operator_token": handoff.get("P2PFAAS_OPERATOR_TOKEN"), "invoke_token": handoff.get("P2PFAAS_INVOKE_TOKEN"),
            "nats_credentials": credentials_from_env(BRIDGE_NATS_ENV) if in_node else None})

    def sibling_env(self) -> dict[str, str]:
        """The environment of one more process of this bridge: the settings its command line lacks."""
        return {"P2PFAAS_CALLBACK_HOSTS": ",".join(self.callback_hosts), "P2PFAAS_P2PFAAS_OPEN": "1" if self.p2pfaas_open else "",
                "P2PFAAS_TLS_CERT": self.tls_cert, "P2PFAAS_TLS_KEY": self.tls_key,
                "P2PFAAS_HTTP_LIMITS": self.http_limits.model_dump_json()}

    def sibling_secrets(self) -> dict[str, str]:
        """What one more process of this bridge is handed at its start: its tokens and identity."""
        secrets: dict[str, str] = {}
        if self.operator_token:
            secrets["P2PFAAS_OPERATOR_TOKEN"] = self.operator_token
        if self.invoke_token:
            secrets["P2PFAAS_INVOKE_TOKEN"] = self.invoke_token
        credentials = self.nats_credentials or credentials_from_env()   # a bridge run on its own: the process's
        if credentials:
            secrets.update(P2PFAAS_NATS_USER=credentials[0], P2PFAAS_NATS_PASSWORD=credentials[1])
        return secrets

    def sibling_argv(self) -> list[str]:
        """The command line of one more process of this bridge (``p2pfaas bridge http``, one process)."""
        argv = [sys.executable, "-m", "p2pfaas.cli", "bridge", "http", "--node", self.node, "--nats-url", self.nats_url,
                "--host", self.host, "--port", str(self.port), "--prefix", self.prefix,
                "--max-payload-bytes", str(self.max_payload_bytes), "--processes", "1"]
        for flag, port in (("--discovery-port", self.discovery_port), ("--learner-port", self.learner_port)):
            if port is not None:
                argv += [flag, str(port)]
        if logging.getLogger().isEnabledFor(logging.INFO):   # this process runs with --verbose
            argv.append("--verbose")
        return argv


async def start_http_bridge(options: HttpBridgeSettings, door: "InProcessDoor | None" = None):
    """Connect, serve, and start the other ``processes`` of this bridge; returns what
    :func:`stop_http_bridge` needs. ``door``: the node this process runs takes direct calls there."""
    from broker.connection import connect
    from broker.http_bridge import HttpBridge

    nc = await connect(options.nats_url, f"http-bridge-{options.node}", credentials=options.nats_credentials)
    bridge = HttpBridge(nc, options.node, prefix=options.prefix, max_payload_bytes=options.max_payload_bytes,
                        operator_token=options.operator_token, invoke_token=options.invoke_token,
                        callback_hosts=options.callback_hosts, p2pfaas_open=options.p2pfaas_open,
                        limits=options.http_limits)
    if door is not None:
        bridge.faas.open_door(options.node, door)
    started = asyncio.Event()
    serving = asyncio.create_task(bridge.serve(options.host, options.port, started, reuse_port=True,
                                               discovery_port=options.discovery_port,
                                               learner_port=options.learner_port, tls=options.tls))
    await asyncio.wait({serving, asyncio.create_task(started.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        serving.result()   # it failed to start: raise why
    siblings = []
    for _ in range(max(0, options.processes - 1)):
        # a bridge process holds its own identity only (none of the node's, nor its workers')
        handed = handoff.handoff_fd(options.sibling_secrets())
        try:
            proc = await asyncio.create_subprocess_exec(
                *options.sibling_argv(), env=child_env(**options.sibling_env(), **{handoff.HANDOFF_FD_ENV: str(handed)}),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, preexec_fn=die_with_parent_preexec,
                pass_fds=(handed,))
        finally:
            os.close(handed)
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            line = await proc.stdout.readline()
        if line.strip() != b"READY":
            raise RuntimeError(f"a bridge process did not start: {line!r}")
        siblings.append(proc)
    return nc, bridge, serving, siblings


async def stop_http_bridge(part) -> None:
    from broker.connection import close_quietly

    nc, bridge, serving, siblings = part
    for proc in siblings:
        proc.send_signal(signal.SIGTERM)
    bridge.shutdown()
    await serving
    await asyncio.gather(*(proc.wait() for proc in siblings))
    await close_quietly(nc)
