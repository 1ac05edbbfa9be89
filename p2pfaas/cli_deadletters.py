"""``p2pfaas dead-letters``: list, show and redrive the tasks the nodes dead-lettered
(broker/deadletters.py), as the `up` stack's operator."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Optional

import orjson
import typer

from p2pfaas.cli_common import _fail, _reported, command_group, console, on_stack
from p2pfaas.cli_functions import DataDir, NatsUrl, Prefix

app = command_group("Dead letters: the async tasks a node would not run again. List, show, redrive them.")
SHOWN_BYTES = 2048   # of a payload, by `show` (--json has it whole)


def _run(data_dir: Path, nats_url: Optional[str], prefix: str, work):
    """``work(js, subjects)`` on the stack's NATS, as its operator."""
    return on_stack(data_dir, nats_url, prefix, "p2pfaas-dead-letters",
                    lambda nc, subjects: work(nc.jetstream(), subjects))


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


@app.command("list")
def list_letters(
    node: Optional[str] = typer.Option(None, help="Only those this node dead-lettered."),
    function: Optional[str] = typer.Option(None, "--function", help="Only those of this function."),
    limit: int = typer.Option(100, min=1, max=100_000, help="At most this many, oldest first."),
    json_out: bool = typer.Option(False, "--json", help="One JSON list instead of the table."),
    nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
) -> None:
    """The dead letters, oldest first: when, which node and function, the call, and why."""
    from rich.console import Console
    from rich.table import Table

    from broker.deadletters import dead_letters

    letters = _run(data_dir, nats_url, prefix,
                   lambda js, subjects: dead_letters(js, subjects, node=node, fn=function, limit=limit))
    if json_out:
        print(orjson.dumps([letter.summary() for letter in letters], option=orjson.OPT_INDENT_2).decode())
        return
    if not letters:
        console.print("no dead letters")
        return
    table = Table(box=None, padding=(0, 2, 0, 0), show_edge=False)
    for header in ("seq", "dead-lettered", "node", "function", "call"):
        table.add_column(header, no_wrap=True, justify="right" if header == "seq" else "left")
    table.add_column("reason", overflow="fold")
    for letter in letters:
        table.add_row(str(letter.seq), _when(letter.at), letter.node, letter.fn, letter.call_key or "-", letter.reason)
    Console().print(table)


@app.command("show")
def show(
    seq: int = typer.Argument(..., min=1, help="Its sequence number (first column of `list`)."),
    json_out: bool = typer.Option(False, "--json", help="As JSON, the payload whole (base64)."),
    nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
) -> None:
    """One dead letter: its cause, its intake subject and headers, and its payload."""
    from broker.deadletters import DeadLetterError, dead_letter

    with _reported(DeadLetterError):
        letter = _run(data_dir, nats_url, prefix, lambda js, subjects: dead_letter(js, subjects, seq))
    if json_out:
        print(orjson.dumps({**letter.summary(), "subject": letter.subject, "headers": letter.headers,
                            "payload_base64": base64.b64encode(letter.payload).decode()},
                           option=orjson.OPT_INDENT_2).decode())
        return
    lines = [f"seq        {letter.seq}", f"when       {_when(letter.at)}", f"node       {letter.node}",
             f"function   {letter.fn}", f"call       {letter.call_key or '-'}", f"reason     {letter.reason}",
             f"subject    {letter.subject or '- (cannot be redriven)'}", "headers"]
    lines += [f"  {name}: {value}" for name, value in sorted(letter.headers.items())]
    shown = letter.payload[:SHOWN_BYTES]
    try:
        text = shown.decode()
    except UnicodeDecodeError:
        text = "base64:" + base64.b64encode(shown).decode()
    cut = f" (the first {SHOWN_BYTES}; --json has it whole)" if len(letter.payload) > SHOWN_BYTES else ""
    lines += [f"payload    {len(letter.payload)} bytes{cut}", text]
    print("\n".join(lines))


@app.command("redrive")
def redrive_letters(
    seqs: list[int] = typer.Argument(None, help="Sequence numbers to redrive (or --all)."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter (of --node, of --function)."),
    node: Optional[str] = typer.Option(None, help="With --all: only those this node dead-lettered."),
    function: Optional[str] = typer.Option(None, "--function", help="With --all: only those of this function."),
    to: Optional[str] = typer.Option(None, "--to", help="Store them in this node's intake (default: the node each was for)."),
    nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
) -> None:
    """Store dead-lettered tasks again in a node's intake, each under a new request id
    (<id>-r<seq>, answered there once), and remove them from the dead letters."""
    from broker.deadletters import DeadLetterError, dead_letter, dead_letters, redrive

    if bool(seqs) == all_:
        _fail("name the dead letters to redrive (their seq, from `p2pfaas dead-letters list`) or give --all")
    if (node or function) and not all_:
        _fail("--node and --function choose among all of them: give --all too")

    async def work(js, subjects):
        letters = (await dead_letters(js, subjects, node=node, fn=function, limit=100_000) if all_
                   else [await dead_letter(js, subjects, seq) for seq in seqs])
        done, failed = [], []
        for letter in letters:
            try:
                done.append((letter, await redrive(js, subjects, letter, to_node=to)))
            except Exception as exc:   # said per letter; the others are still redriven
                failed.append((letter, str(exc) if isinstance(exc, DeadLetterError) else f"{type(exc).__name__}: {exc}"))
        return done, failed

    with _reported(DeadLetterError):
        done, failed = _run(data_dir, nats_url, prefix, work)
    for letter, (key, target) in done:
        print(f"redriven {letter.seq} ({letter.fn}, {letter.call_key}) as {key} to {target}")
    for letter, reason in failed:
        console.print(f"[red]not redriven[/] {letter.seq}: {reason}")
    if not done and not failed:
        print("no dead letters")
    if failed:
        raise typer.Exit(1)
