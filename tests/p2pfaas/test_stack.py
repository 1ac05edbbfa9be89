"""The stack launcher's nats-server log: one file, DATA_DIR/logs/nats-server.log, where ``up``
says its logs are and where the full-disk healer reads it (it used to be DATA_DIR/nats/
nats-server.log, with an empty file in logs/)."""

from __future__ import annotations

import asyncio
import signal

from broker.embedded import NatsServer
from p2pfaas.stack import Stack, log_to_stderr
from p2pfaas.stack_settings import StackSettings

from support import wait_until


def test_nats_server_logs_on_stderr_for_the_supervisor(tmp_path):
    argv = NatsServer(data_dir=tmp_path / "nats", port=0).configure()
    assert "-l" in argv   # otherwise there is nothing to take out and this test says nothing
    kept = log_to_stderr(argv)
    assert "-l" not in kept and str(tmp_path / "nats" / "nats-server.log") not in kept
    assert kept[kept.index("-c") + 1] == str(tmp_path / "nats" / "nats-server.conf")


async def test_the_store_healer_reads_the_log_up_names(tmp_path):
    """A failed store write in logs/nats-server.log restarts nats-server once the disk has room."""
    stack = Stack(StackSettings(data_dir=tmp_path))
    server = NatsServer(data_dir=tmp_path / "nats")
    server.data_dir.mkdir()
    signals: list[tuple[str, int]] = []
    stack.supervisor.signal = lambda name, sig: signals.append((name, sig))
    log = tmp_path / "logs" / "nats-server.log"
    log.parent.mkdir()
    log.write_bytes(b"[1] 2026/12/01 07:01:16.994361 [INF] Server is ready\n")
    heal = asyncio.create_task(stack._heal_store(server, period_s=0.05))
    try:
        await asyncio.sleep(0.2)
        assert not signals
        with log.open("ab") as f:
            f.write(b"[1] 2026/12/01 07:01:17.000000 [ERR] JetStream failed to store a msg on stream 'X'\n")
        await wait_until(lambda: signals, 5)
    finally:
        heal.cancel()
    assert signals == [("nats-server", signal.SIGTERM)]
