"""Dead letters as an operator handles them (the stream could be neither inspected nor redriven),
and the retry back-off of a task whose worker died (a fixed 1 s before): real node, real workers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import textwrap

import pytest

from broker import headers as H
from broker.codec import decode
from broker.deadletters import dead_letters
from broker.messages import Result
from broker.subjects import Subjects
from functions.spec import FunctionSpec
from nodes.answering import retry_delay_s
from support import Collector, wait_until

CODE = """
    import os
    import time

    def heal(payload: bytes) -> bytes:   # takes its worker with it until its marker file exists
        if os.path.exists(payload.decode()):
            return b"healed"
        os._exit(3)

    def stamped(payload: bytes) -> bytes:   # notes when it ran, then takes its worker with it
        with open(payload.decode(), "a") as out:
            out.write(f"{time.time()}\\n")
        os._exit(3)
    stamped.p2pfaas_retry_backoff_s = (0.5, 2.5)
"""


@pytest.fixture
def flaky(tmp_path_factory, monkeypatch):
    code = tmp_path_factory.mktemp("flakyfns")
    (code / "flakyfns.py").write_text(textwrap.dedent(CODE))
    code.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", f"{code}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(code))
    return code, [("heal", "flakyfns:heal"), ("stamped", "flakyfns:stamped")]


def cli(nats_server, prefix, tmp_path, *args) -> subprocess.CompletedProcess:
    from stack_processes import P2PFAAS

    return subprocess.run([*P2PFAAS, "dead-letters", *args, "--nats-url", nats_server.url, "--prefix", prefix,
                           "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "80"})


async def test_a_redriven_dead_letter_is_answered_once(node_factory, faas, nc, nats_server, prefix, tmp_path, flaky):
    code, functions = flaky
    marker = code / "fixed"
    s = Subjects(prefix)
    async with Collector(nc, s.result("dev1", "sick")) as first, \
            node_factory(k=1, queue=5, runtime="process", functions=functions, max_deliver=2) as node:
        await faas.submit("n1", "heal", str(marker).encode(), "sick")
        await wait_until(lambda: len(first.messages) >= 1, timeout_s=40)
        assert decode(Result, first.messages[0].data).status == 500          # dead-lettered: its caller told

        listed = cli(nats_server, prefix, tmp_path, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        [letter] = json.loads(listed.stdout)
        assert letter["node"] == "n1" and letter["function"] == "heal" and letter["call"] == "dev1.sick"
        assert "delivered 2 times" in letter["reason"] and letter["bytes"] == len(str(marker))
        table = cli(nats_server, prefix, tmp_path, "list")
        assert table.returncode == 0 and all(len(line) <= 80 for line in table.stdout.splitlines()), table.stdout
        assert "dev1.sick" in table.stdout and "heal" in table.stdout
        shown = cli(nats_server, prefix, tmp_path, "show", str(letter["seq"]))
        assert shown.returncode == 0 and f"subject    {s.async_request('n1', 'heal', 'dev1', 'sick')}" in shown.stdout
        assert str(marker) in shown.stdout

        marker.write_text("")   # the cause is fixed: redrive it
        await node.pool.wait_ready(30)
        seq = letter["seq"]
        again = Collector(nc, s.result("dev1", f"sick-r{seq}"))
        async with again:
            redriven = cli(nats_server, prefix, tmp_path, "redrive", str(seq))
            assert redriven.returncode == 0, redriven.stderr
            assert redriven.stdout.strip() == f"redriven {seq} (heal, dev1.sick) as dev1.sick-r{seq} to n1"
            await wait_until(lambda: len(again.messages) >= 1, timeout_s=30)
            await asyncio.sleep(1.5)   # the window in which a second answer would show up
        assert len(again.messages) == 1 and len(first.messages) == 1
        answer = decode(Result, again.messages[0].data)
        assert answer.status == 200 and answer.output == "healed"
        assert await dead_letters(nc.jetstream(), s) == []                   # removed once redriven
        gone = cli(nats_server, prefix, tmp_path, "redrive", str(seq))
        assert gone.returncode == 2 and f"no dead letter {seq}" in gone.stderr, gone.stderr
        nothing = cli(nats_server, prefix, tmp_path, "redrive")
        assert nothing.returncode == 2 and "or give --all" in nothing.stderr

        # all of them, to another node
        other = code / "fixed-later"
        async with Collector(nc, s.result("dev1", "sick2")) as second:
            await faas.submit("n1", "heal", str(other).encode(), "sick2")
            await wait_until(lambda: len(second.messages) >= 1, timeout_s=40)
        other.write_text("")
        [letter] = await dead_letters(nc.jetstream(), s)
        async with node_factory(node_id="n2", k=1, runtime="process", functions=functions), \
                Collector(nc, s.result("dev1", f"sick2-r{letter.seq}")) as moved:
            redriven = cli(nats_server, prefix, tmp_path, "redrive", "--all", "--to", "n2")
            assert redriven.returncode == 0 and redriven.stdout.strip().endswith("to n2"), redriven.stderr
            await wait_until(lambda: len(moved.messages) >= 1, timeout_s=30)
        assert decode(Result, moved.messages[0].data).executed_by == "n2"


async def test_retries_wait_the_functions_back_off(node_factory, faas, nc, prefix, tmp_path, flaky):
    """stamped's back-off is (0.5, 2.5): its 2nd run comes 0.5 s after the 1st ended, its 3rd
    2.5 s after the 2nd (plus the time to see the worker die); the 4th delivery dead-letters."""
    _, functions = flaky
    stamps_dir = tmp_path / "stamps"
    stamps_dir.mkdir()
    stamps_dir.chmod(0o777)
    stamps = stamps_dir / "runs"
    s = Subjects(prefix)
    async with Collector(nc, s.result("dev1", "backoff")) as results, \
            node_factory(k=1, queue=5, runtime="process", functions=functions, max_deliver=4,
                         worker_writable=[stamps_dir]):
        await faas.submit("n1", "stamped", str(stamps).encode(), "backoff")
        await wait_until(lambda: len(results.messages) >= 1, timeout_s=60)
    runs = [float(line) for line in stamps.read_text().split()]
    assert len(runs) == 3, runs
    gaps = [b - a for a, b in zip(runs, runs[1:])]
    assert 0.5 <= gaps[0] < 0.5 + 3.0 and 2.5 <= gaps[1] < 2.5 + 3.0, gaps
    assert gaps[1] - gaps[0] > 1.0, gaps   # the schedule, not the same wait twice
    kept = (await dead_letters(nc.jetstream(), s, fn="stamped"))[0]
    assert "delivered 4 times" in kept.reason and kept.headers[H.DEAD_LETTER_SUBJECT].endswith(".backoff")


def test_a_functions_back_off_wins_and_the_last_wait_repeats():
    assert [retry_delay_s((), (1.0, 3.0), n) for n in (1, 2, 7)] == [1.0, 3.0, 3.0]
    assert [retry_delay_s((0.5,), (1.0, 3.0), n) for n in (1, 2)] == [0.5, 0.5]
    with pytest.raises(ValueError, match="retry_backoff_s must be seconds"):
        FunctionSpec("f", lambda p: p, retry_backoff_s=(0.0,))
