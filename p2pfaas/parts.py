"""One part of the system as a process of its own (``p2pfaas node``, ``p2pfaas bridge ...``):
started on the fast event loop, announced with a ``READY`` line on stdout (what a supervisor
waits for), stopped on SIGINT/SIGTERM or when its parent ends, within a deadline."""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from broker.embedded import die_with_parent_preexec
from broker.lifecycle import child_env, hard_exit_after, on_parent_gone, parent_gone, parent_pipe_watched, run_loop

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
@dataclass
class HttpBridgeOptions:
    node: str
    nats_url: str
    host: str = "127.0.0.1"
    port: int = 18080
    prefix: str = "faas"
    max_payload_bytes: int = 1024 * 1024
    processes: int = 1
    operator_token: str | None = None    # docs/security.md
    invoke_token: str | None = None
    callback_hosts: tuple[str, ...] = ()
    tls: tuple[str, str] | None = None   # (certificate, key): HTTPS
    p2pfaas_open: bool = False           # P2PFaaS's discovery/learner ports take changes without a token
    discovery_port: int | None = None   # P2PFaaS's discovery API (19000) by this process too
    learner_port: int | None = None     # P2PFaaS's learner API (19020)


async def start_http_bridge(options: HttpBridgeOptions, argv_for_one: list[str] | None = None):
    """Connect, serve, and (with ``processes`` > 1) start the other processes of this bridge;
    returns what :func:`stop_http_bridge` needs."""
    from broker.connection import connect
    from broker.http_bridge import HttpBridge

    nc = await connect(options.nats_url, f"http-bridge-{options.node}")
    bridge = HttpBridge(nc, options.node, prefix=options.prefix, max_payload_bytes=options.max_payload_bytes,
                        operator_token=options.operator_token, invoke_token=options.invoke_token,
                        callback_hosts=options.callback_hosts, p2pfaas_open=options.p2pfaas_open)
    started = asyncio.Event()
    serving = asyncio.create_task(bridge.serve(options.host, options.port, started, reuse_port=True,
                                               discovery_port=options.discovery_port,
                                               learner_port=options.learner_port, tls=options.tls))
    await asyncio.wait({serving, asyncio.create_task(started.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        serving.result()   # it failed to start: raise why
    siblings = []
    for _ in range(max(0, options.processes - 1)):
        assert argv_for_one is not None
        proc = await asyncio.create_subprocess_exec(*argv_for_one, env=child_env(), stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, preexec_fn=die_with_parent_preexec)
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


def one_process_argv(argv: list[str]) -> list[str]:
    """This command line with ``--processes 1``: what each sibling bridge process runs."""
    out, skip = [sys.executable, "-m", "p2pfaas.cli"], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg == "--processes":
            skip = True
            continue
        if arg.startswith("--processes="):
            continue
        out.append(arg)
    return [*out, "--processes", "1"]
