"""What the CLI's commands share: one-line errors, the checks before a start, running a stack until
Ctrl-C, and attaching to a running stack (its endpoints, its NATS, its identities)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from broker.errors import BrokerUnavailable, FaasError
from controller.names import MODEL_SUFFIXES, PolicyNameError, canonical

console = Console(stderr=True, soft_wrap=True)   # a line of figures stays one line in a file or a pipe
STOP_TIMEOUT_S = float(os.environ.get("P2PFAAS_STOP_TIMEOUT_S", 60.0))  # up's whole shutdown
MAX_PORT = 65535
FUNCTION_IMPORT_TIMEOUT_S = 120.0   # importing the --function modules, checked before up starts anything


class MqttChoice(str, Enum):
    nats = "nats"
    mosquitto = "mosquitto"
    off = "off"


class Runtime(str, Enum):
    process = "process"
    inprocess = "inprocess"
    docker = "docker"


def command_group(help: str) -> typer.Typer:
    """Help as click's plain text: wrapped to the terminal (80 columns in a file) without cutting a flag."""
    return typer.Typer(help=help, no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def _fail(message: str) -> NoReturn:
    """What a user can fix (bad input, an unreachable broker, an unusable data dir): one red line
    saying what is wrong and what to do, exit code 2, never a traceback."""
    console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)   # one line: grep finds it whole
    raise typer.Exit(2)


def _failed_with(exc: Exception) -> NoReturn:
    """:func:`_fail` for an error caught broadly; another's than ours keeps its class name (a bare
    TimeoutError says nothing alone)."""
    if isinstance(exc, FaasError) and str(exc):
        todo = "; is its `p2pfaas up` running? (else give --nats-url)" if isinstance(exc, BrokerUnavailable) else ""
        _fail(f"{exc}{todo}")
    _fail(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


@contextmanager
def _reported(*errors: type[Exception], todo: str = ""):
    """:func:`_fail` with the message of one of ``errors`` raised in the block (and ``todo``)."""
    try:
        yield
    except errors as exc:
        _fail(f"{exc}; {todo}" if todo else str(exc))


def _usable_data_dir(data_dir: Path) -> None:
    """Everything ``up`` keeps is under ``data_dir``: a path that cannot be that is said at once."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except FileExistsError:
        _fail(f"--data-dir {data_dir} is a file, not a directory: give a directory")
    except OSError as exc:
        _fail(f"--data-dir {data_dir} cannot be used ({exc.strerror or exc}): give a directory you may write to")


def on_stack(data_dir: Path, nats_url: str | None, prefix: str, client: str, work):
    """``await work(nc, subjects)`` on the NATS of the `up` in ``data_dir`` (or ``nats_url``), as
    its operator: what the tools run by hand (dead-letters, deploy, list, ...) share."""
    from broker.connection import close_quietly, connect
    from broker.subjects import Subjects

    url = _stack_nats_url(data_dir, nats_url)
    _stack_identity(data_dir)

    async def main():
        nc = await connect(url, client)
        try:
            return await work(nc, Subjects(prefix))
        finally:
            await close_quietly(nc)

    with _reported(BrokerUnavailable, todo=START_THE_STACK):
        return asyncio.run(main())


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _functions(specs: list[str]) -> list[tuple[str, str]]:
    from functions.registry import parse_function_specs
    return [pair for spec in specs for pair in parse_function_specs(spec)]


# run by `python -c` as a node imports them: "name=reference" arguments, the first failure on stderr
IMPORT_REFERENCES = """
import sys
from functions.image import check_engine, parse_image_reference
from functions.registry import load_reference
for spec in sys.argv[1:]:
    name, _, reference = spec.partition("=")
    try:
        image = parse_image_reference(reference)
        if image is not None:
            check_engine(image)
        else:
            load_reference(reference)
    except ValueError as exc:
        sys.exit(f"\\n--function {spec}: {exc}")
    except Exception as exc:
        sys.exit(f"\\n--function {spec}: importing it raised {type(exc).__name__}: {exc}")
"""


def _importable(functions: list[tuple[str, str]], sandbox=None) -> None:
    """Every --function reference imports and names a callable (an image: its engine has it), checked
    before anything starts, in a child process as a worker imports it: the current directory on
    sys.path, in the workers' ``sandbox``, and without importing the user's modules into ``up``."""
    if not functions:
        return
    try:
        done = subprocess.run([sys.executable, "-c", IMPORT_REFERENCES, *(f"{n}={r}" for n, r in functions)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=FUNCTION_IMPORT_TIMEOUT_S, preexec_fn=sandbox.preexec() if sandbox else None)
    except subprocess.TimeoutExpired:
        _fail(f"importing the --function modules took over {FUNCTION_IMPORT_TIMEOUT_S:g} s: "
              "a module should not work when imported")
    if done.returncode != 0:   # the last line is ours (a module may write on stderr before it)
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        _fail(lines[-1] if lines else f"checking the --function references failed (exit code {done.returncode})")


def _sandbox(settings=None, **fields):
    """The workers' sandbox (nodes/sandbox.py) of ``settings`` (or NodeSettings(**fields)): a worker
    user that cannot run the workers is said before anything starts."""
    from nodes.sandbox import decide
    from nodes.settings import NodeSettings

    with _reported(ValueError):
        return decide(settings or NodeSettings(**fields))


def _engine_has(image: str, build: str) -> None:
    """The Docker engine answers and has the workers' ``image`` (``build`` makes it)."""
    from functions.image import check_engine

    with _reported(ValueError, todo="or use --runtime process"):
        check_engine(image, build=build)


def _stop_on_signal(stop: asyncio.Event) -> None:
    """SIGINT/SIGTERM set ``stop`` from now on (asyncio.run's own SIGINT handling would cancel
    whatever runs, and a cancellation swallowed on its way is a stop request lost)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def serve_stack(settings) -> None:
    """Start a stack (``up``, ``join``), print its endpoints, run until Ctrl-C, stop it within
    STOP_TIMEOUT_S (then kill what is left)."""
    from broker.errors import DataDirInUse
    from p2pfaas.stack import Stack

    async def main() -> None:
        stop = asyncio.Event()
        _stop_on_signal(stop)   # a Ctrl-C while the stack starts is honoured once the start is over
        with console.status("starting p2pfaas ..."):
            stack = Stack(settings)
            # e.g. a policy with no trained model, a part that fails, an identity file broken by hand
            with _reported(ValueError, BrokerUnavailable, DataDirInUse, OSError):
                endpoints = await stack.start()
        try:
            for note in endpoints.notes:
                console.print(f"[yellow]note:[/] {note}")
            console.print("[bold green]p2pfaas is up[/]")
            for line in endpoints.lines():
                console.print("  " + line)
            first = next(iter(endpoints.http.values()))
            console.print(f"  try: curl -X POST {first}/function/fib -d 25")
            console.print(f"  logs in {settings.data_dir / 'logs'}; Ctrl-C to stop")
            await stop.wait()
            console.print("stopping ...")
        finally:
            stopping = asyncio.create_task(stack.stop())
            # bounded: a part that does not stop must not keep the stack (and its children) alive
            done, _ = await asyncio.wait({stopping}, timeout=STOP_TIMEOUT_S)
            if not done:
                console.print(f"[red]shutdown did not finish within {STOP_TIMEOUT_S:g} s; killing what is left[/]")
                stack.supervisor.kill_all()   # and the workers of a killed node end with it (their pipe)
                os._exit(1)
            stopping.result()
        console.print("stopped")

    asyncio.run(main())


START_THE_STACK = "is the stack running? Start it with `p2pfaas up`, or name a running NATS with --nats-url"

def _policy_name(name: str, flag: str, *, off: bool = False) -> str:
    """The policy as the parts take it (a model file by its absolute path: they run elsewhere);
    a name no command knows is said before anything starts, with the nearest names."""
    try:
        name = canonical(name, off=off)
    except PolicyNameError as exc:
        _fail(f"{flag}: {exc}")
    return str(Path(name).resolve()) if name.endswith(MODEL_SUFFIXES) else name

def _positive_seconds(value: Optional[float]) -> Optional[float]:
    """A duration that must be more than 0, refused as typer refuses a value out of range (typer
    has no open range: min=0 would let 0 through)."""
    if value is not None and value <= 0:
        raise typer.BadParameter(f"{value:g} is not more than 0 seconds")
    return value

def _running_stack(data_dir: Path, flag: str) -> dict:
    """The endpoints the ``up`` running on ``data_dir`` wrote; without them, ``flag`` is needed (never
    a default URL: whatever listened there, another stack's NATS say, would pass for this stack)."""
    from p2pfaas.stack_settings import read_endpoints

    known = read_endpoints(data_dir)
    if not known:
        _fail(f"no running `p2pfaas up` found in {data_dir} (no {data_dir / 'endpoints.json'}): "
              f"start one, or give {flag}")
    return known

def _stack_nats_url(data_dir: Path, nats_url: Optional[str]) -> str:
    return nats_url or _running_stack(data_dir, "--nats-url")["nats_url"]

def _attach(data_dir: Path, nats_url: Optional[str]):
    """The NATS a part attaches to (``nats_url``, else the one of the `up` on ``data_dir``) and the
    stack's identity store. Run by hand, a part acts as that stack's operator; one `up` started
    has its own identity, which another data dir's files must not replace."""
    from broker.lifecycle import parent_pipe_watched

    url = _stack_nats_url(data_dir, nats_url)
    return url, None if parent_pipe_watched() else _stack_identity(data_dir)

def _stack_store(data_dir: Path, required: bool = False):
    """The identity store `up` made in ``data_dir``; None when there is none (no stack was set
    up there, or an --insecure one), unless ``required``: then that is said, exit code 2."""
    from broker.auth import AuthStore

    directory = data_dir / "auth"
    if (directory / "services.json").exists():
        return AuthStore(directory)
    if required:   # a store made here would hold identities no running stack accepts
        _fail(f"no stack has been set up in {data_dir} (no identities in {directory}): run `p2pfaas up "
              f"--data-dir {data_dir}` first (an --insecure stack has none)")
    return None

def _stack_identity(data_dir: Path):
    """The identity store of the `up` stack in ``data_dir`` (None when it has none); tools run by
    hand act as its operator on NATS (parts started by `up` already have their own identity)."""
    from broker import handoff
    from broker.auth import OPERATOR, AuthStoreError

    store = _stack_store(data_dir)
    if store is None:
        return None
    ca = data_dir / "tls" / "ca.pem"
    if ca.exists() and not os.environ.get("P2PFAAS_TLS_CA"):
        os.environ["P2PFAAS_TLS_CA"] = str(ca)
    if not handoff.get("P2PFAAS_NATS_USER"):
        with _reported(AuthStoreError, OSError):
            operator = store.service(OPERATOR)
        handoff.hold(P2PFAAS_NATS_USER=operator.user, P2PFAAS_NATS_PASSWORD=operator.password)
    return store
