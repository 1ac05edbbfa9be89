"""``p2pfaas top``: a live view of nodes (heartbeats), pools (telemetry, and pulses between control
periods) and who scales them (scale commands)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from broker.codec import decode
from broker.connection import close_quietly, connect
from broker.errors import ContractError
from broker.messages import Heartbeat, PoolPulse, PoolTelemetry, ScaleCommand
from broker.subjects import Subjects


@dataclass
class TopView:
    nodes: dict[str, Heartbeat] = field(default_factory=dict)
    pools: dict[tuple[str, str], PoolTelemetry] = field(default_factory=dict)
    pulses: dict[tuple[str, str], PoolPulse] = field(default_factory=dict)
    commands: dict[tuple[str, str], ScaleCommand] = field(default_factory=dict)

    def render(self, now: float | None = None) -> Group:
        """Three narrow tables, each whole at 80 columns: nodes, pools (a pool with a long control
        period is shown from its pulses until its first period ends) and who scales them."""
        now = now or time.time()
        nodes = _table("nodes", "node", "address", "running", "queued", "K", "queue max", "seen")
        for hb in sorted(self.nodes.values(), key=lambda h: h.node):
            nodes.add_row(hb.node, hb.address or "-", str(hb.running), str(hb.queued),
                          str(hb.parallel_running_functions_max), str(hb.queue_length_max),
                          f"{max(0.0, now - hb.time):.1f}s ago")
        pools = _table("pools", "node", "pool", "ready", "starting", "queue", "busy", "in/s", "done/s", "p95",
                       "QoS")
        for key in sorted({*self.pools, *self.pulses}):
            t, pulse = self.pools.get(key), self.pulses.get(key)
            if pulse is not None and (t is None or pulse.time > t.time):   # the newer of the two
                pools.add_row(*key, str(pulse.workers_ready), str(pulse.workers_starting), str(pulse.queue_length),
                              "-", f"{pulse.arrivals / pulse.window_s:.2f}", "-", "-",
                              f"{t.qos:.1%}" if t else "-")
                continue
            assert t is not None
            qos_style = "green" if t.qos >= 0.99 else "yellow" if t.qos >= 0.9 else "red"
            pools.add_row(*key, str(t.workers_ready), str(t.workers_starting), str(t.queue_length),
                          str(t.in_service), f"{t.arrival_rate:.2f}", f"{t.throughput:.2f}",
                          f"{t.latency_p95_s * 1000:.0f} ms", f"[{qos_style}]{t.qos:.1%}[/]")
        scaling = _table("scaling", "node", "pool", "target", "policy", "model")
        for (node, pool), command in sorted(self.commands.items()):
            scaling.add_row(node, pool, str(command.target_workers), command.policy or "?",
                            command.model_version or "-")
        return Group(nodes, "", pools, "", scaling)


TEXT_COLUMNS = {"node", "address", "pool", "policy", "model", "seen"}


def _table(title: str, *columns: str) -> Table:
    """A table that folds a long cell onto a second line rather than cutting it with an ellipsis."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", show_edge=False, padding=(0, 1, 0, 0))
    for column in columns:
        table.add_column(column, overflow="fold", min_width=len(column),
                         justify="left" if column in TEXT_COLUMNS else "right")
    return table


async def watch(nats_url: str, prefix: str = "faas", *, refresh_s: float = 1.0, duration_s: float | None = None,
                live: bool = True, out: Console | None = None) -> TopView:
    """Follow heartbeats and telemetry, for ``duration_s`` if given; ``live``: every ``refresh_s``, redraw
    the screen, or print a timestamped snapshot on a file or pipe (where a live screen is drawn only
    when it stops). Not ``live``: just collect."""
    subjects = Subjects(prefix)
    view = TopView()
    out = out or Console()
    nc = await connect(nats_url, "p2pfaas-top")

    def keep_newest(contract, table: dict, key):
        """A callback storing each valid message in ``table`` under ``key(message)``."""
        async def on_message(msg) -> None:
            try:
                message = decode(contract, msg.data)
            except ContractError:
                return
            table[key(message)] = message
        return on_message

    await nc.subscribe(subjects.all_membership(), cb=keep_newest(Heartbeat, view.nodes, lambda hb: hb.node))
    await nc.subscribe(subjects.all_telemetry(), cb=keep_newest(PoolTelemetry, view.pools, lambda t: (t.node, t.pool)))
    await nc.subscribe(subjects.all_pulses(), cb=keep_newest(PoolPulse, view.pulses, lambda p: (p.node, p.pool)))
    await nc.subscribe(subjects.all_scale(), cb=keep_newest(ScaleCommand, view.commands, lambda c: (c.node, c.pool)))
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        if not live:
            await asyncio.sleep(duration_s or 0)
            return view
        if not out.is_terminal:
            while deadline is None or time.monotonic() < deadline:
                await asyncio.sleep(refresh_s)
                out.print(f"-- {time.strftime('%Y-%m-%d %H:%M:%S')}", highlight=False)
                out.print(view.render())
                out.file.flush()   # a file is block-buffered: each snapshot is there as soon as printed
            return view
        with Live(view.render(), console=out, refresh_per_second=4, screen=False) as screen:
            while deadline is None or time.monotonic() < deadline:
                await asyncio.sleep(refresh_s)
                screen.update(view.render())
    finally:
        await close_quietly(nc)
    return view
