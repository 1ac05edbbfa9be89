"""``p2pfaas secret create | update | list | remove``: the deployment's secrets, as faas-cli has
them; a value is sealed by the node that takes it (broker/secrets.py) and never printed back."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from p2pfaas.cli_common import _fail, _reported, command_group, console
from p2pfaas.cli_functions import DataDir, FunctionsError, NatsUrl, Node, Prefix, _ask, _run

app = command_group("The deployment's secrets, which functions read with functions.secret(NAME).")


def _value(literal: Optional[str], from_file: Optional[Path]) -> str:
    if literal is not None and from_file is not None:
        _fail("give --from-literal or --from-file, not both")
    if from_file is not None:
        try:
            return from_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            _fail(f"{from_file}: {exc}")
    if literal is not None:
        return literal
    if sys.stdin.isatty():
        _fail("give the value with --from-literal, --from-file, or on standard input")
    return sys.stdin.read().rstrip("\n")


def _set(name: str, literal: Optional[str], from_file: Optional[Path], mode: str, node: str,
         nats_url: Optional[str], data_dir: Path, prefix: str) -> None:
    body = {"name": name, "value": _value(literal, from_file), "mode": mode}
    with _reported(FunctionsError):
        _run(data_dir, nats_url, prefix, lambda nc, subjects: _ask(nc, subjects, node, "secrets_set", body))
    console.print(f"{'created' if mode == 'create' else 'updated'} secret {name} (a function gets it when deployed "
                  "with --secret " + name + ")")


FromLiteral = typer.Option(None, "--from-literal", help="The value (visible to a process listing: prefer a file or stdin).")
FromFile = typer.Option(None, "--from-file", help="Read the value from this file.")


@app.command("create")
def create(name: str = typer.Argument(..., help="Lower case letters, digits, '-' and '.'."),
           literal: Optional[str] = FromLiteral, from_file: Optional[Path] = FromFile,
           node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix) -> None:
    """Create a secret (refused if it exists: update it)."""
    _set(name, literal, from_file, "create", node, nats_url, data_dir, prefix)


@app.command("update")
def update(name: str = typer.Argument(..., help="The secret."),
           literal: Optional[str] = FromLiteral, from_file: Optional[Path] = FromFile,
           node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix) -> None:
    """Change a secret's value; functions get it when their workers start next (deploy them again)."""
    _set(name, literal, from_file, "update", node, nats_url, data_dir, prefix)


@app.command("list")
def list_secrets(node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir,
                 prefix: str = Prefix) -> None:
    """The secrets' names (never their values)."""
    with _reported(FunctionsError):
        names = _run(data_dir, nats_url, prefix, lambda nc, subjects: _ask(nc, subjects, node, "secrets_list", {}))
    print("\n".join(item["name"] for item in names) if names else "no secrets")


@app.command("remove")
def remove(name: str = typer.Argument(..., help="The secret."),
           node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix) -> None:
    """Remove a secret no function uses."""
    with _reported(FunctionsError):
        _run(data_dir, nats_url, prefix, lambda nc, subjects: _ask(nc, subjects, node, "secrets_delete", {"name": name}))
    print(f"removed secret {name}")
