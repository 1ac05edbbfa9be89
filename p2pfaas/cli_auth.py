"""``p2pfaas auth``: the identities of an `up` stack (devices, the operator token); a hub's are mounted from cli_edge."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from p2pfaas.cli_common import (_reported, _stack_store, command_group, console)

app = command_group("Identities of an `up` stack (devices, the operator token) and of a hub (invitations).")


ENROL_TIMEOUT_S = 20.0   # `auth device` waits this long for a running `up` to let the device in

@app.command("device")
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

@app.command("operator")
def auth_operator(
    data_dir: Path = typer.Option(Path("data"), help="The stack's data dir (its identities are in DATA_DIR/auth)."),
) -> None:
    """Print the operator token: `Authorization: Bearer <token>` on routes that change state."""
    from broker.auth import AuthStoreError

    store = _stack_store(data_dir, required=True)
    with _reported(AuthStoreError, OSError):
        print(store.operator_token())
