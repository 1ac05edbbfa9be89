"""``p2pfaas deploy | list | describe | remove | logs``: the deployment's functions, as faas-cli has them
(docs/compat.md). A deploy or a removal goes to one node and reaches every node through the
catalogue (nodes/catalogue.py); the command returns once every node that is up says so."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Optional

import orjson
import typer

from p2pfaas.cli_common import _fail, _reported, console, on_stack

CONVERGE_TIMEOUT_S = 60.0   # every node that is up has applied it (a deploy replaces workers: seconds)
HEARD_S = 2.5               # listening to heartbeats for who is up: more than two periods

NatsUrl = typer.Option(None, help="NATS URL (default: from a running `p2pfaas up`).")
DataDir = typer.Option(Path("data"), help="Where `p2pfaas up` wrote endpoints.json.")
Prefix = typer.Option("faas", help="Subject prefix.")
Node = typer.Option("n1", "--node", help="The node to ask (every node has the deployment's functions).")


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"{flag} {item!r} must look like NAME=VALUE")
        out[key] = value
    return out


def _run(data_dir: Path, nats_url: Optional[str], prefix: str, work):
    return on_stack(data_dir, nats_url, prefix, "p2pfaas-functions", work)


async def _ask(nc, subjects, node: str, verb: str, body: dict, timeout_s: float = 90.0):
    from broker.control import control_request

    status, data = await control_request(nc, subjects.functions(node, verb), orjson.dumps(body), timeout_s)
    if status != 200:
        try:
            message = orjson.loads(data).get("message", data.decode(errors="replace"))
        except (orjson.JSONDecodeError, AttributeError):
            message = data.decode(errors="replace")
        raise FunctionsError(f"{node} answered {status}: {message}")
    return orjson.loads(data)


class FunctionsError(Exception):
    pass


async def _nodes_up(nc, subjects) -> set[str]:
    """The nodes whose heartbeats come within HEARD_S."""
    from broker.codec import decode
    from broker.errors import ContractError
    from broker.messages import Heartbeat

    heard: set[str] = set()

    async def on(msg) -> None:
        try:
            heard.add(decode(Heartbeat, msg.data).node)
        except ContractError:
            pass

    sub = await nc.subscribe(subjects.all_membership(), cb=on)
    await asyncio.sleep(HEARD_S)
    await sub.unsubscribe()
    return heard


async def _converged(nc, subjects, name: str, present: bool) -> tuple[list[str], list[str]]:
    """(nodes that agree, nodes that do not within CONVERGE_TIMEOUT_S): has ``name`` or not."""
    nodes = sorted(await _nodes_up(nc, subjects))
    waiting, deadline = set(nodes), time.monotonic() + CONVERGE_TIMEOUT_S
    while waiting and time.monotonic() < deadline:
        for node in sorted(waiting):
            try:
                listed = {f["name"] for f in await _ask(nc, subjects, node, "list", {}, timeout_s=5.0)}
            except Exception:   # a node going away meanwhile: asked again
                continue
            if (name in listed) == present:
                waiting.discard(node)
        if waiting:
            await asyncio.sleep(0.5)
    return [n for n in nodes if n not in waiting], sorted(waiting)


def _say_converged(what: str, name: str, agreed: list[str], late: list[str]) -> None:
    print(f"{what} {name}" + (f" on {', '.join(agreed)}" if agreed else ""))
    if late:
        console.print(f"[yellow]not yet on {', '.join(late)}[/] after {CONVERGE_TIMEOUT_S:g} s "
                      f"(their logs say why: `grep {name} data/logs/node-*.log`)")


STACK_KEYS = {"image": "image", "reference": "reference", "environment": "envVars", "labels": "labels",
              "annotations": "annotations", "secrets": "secrets", "limits": "limits", "timeout": "timeout",
              "concurrency": "concurrency", "scaling": "scaling"}


def _stack_functions(path: Path) -> list[dict]:
    """The deployments of a stack file: ``functions: {name: {image | reference, environment, labels,
    annotations, secrets, limits, timeout, concurrency, scaling}}`` (faas-cli's stack.yml keys, and
    p2pfaas's; ``handler``/``lang`` builds are not done), read as the OpenFaaS routes read a body."""
    import yaml

    from broker.deploy_body import DeployBodyError, read_deployment

    try:
        stack = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        _fail(f"{path}: {exc}")
    functions = stack.get("functions") if isinstance(stack, dict) else None
    if not isinstance(functions, dict) or not functions:
        _fail(f"{path}: no `functions:` to deploy (a map of name: {{image: ... or reference: ...}})")
    out = []
    for name, spec in functions.items():
        spec = spec or {}
        unknown = sorted(set(spec) - set(STACK_KEYS))
        if unknown:
            _fail(f"{path}: function {name}: {', '.join(unknown)} not supported ({', '.join(STACK_KEYS)})")
        if bool(spec.get("image")) == bool(spec.get("reference")):
            _fail(f"{path}: function {name}: give image or reference (module:callable), one of them")
        body = {STACK_KEYS[k]: v for k, v in spec.items()}
        for key in ("envVars", "labels", "annotations"):
            body[key] = {str(k): str(v) for k, v in (body.get(key) or {}).items()}
        try:
            out.append(read_deployment({"service": str(name), **body}).model_dump(exclude_defaults=True))
        except DeployBodyError as exc:
            _fail(f"{path}: function {name}: {exc}")
    return out


def _flags_deployment(name: str, reference: Optional[str], image: Optional[str], env: list[str], label: list[str],
                      annotation: list[str], secret: list[str], memory: Optional[str], cpu: Optional[str],
                      timeout: Optional[str], concurrency: Optional[int], scale_min: Optional[int],
                      scale_max: Optional[int], idle: Optional[str], policy: Optional[str]) -> dict:
    """One deployment from deploy's flags, read as the OpenFaaS routes read a body."""
    from broker.deploy_body import DeployBodyError, duration_s, read_deployment
    from controller.names import MODEL_SUFFIXES, PolicyNameError, canonical

    body: dict = {"service": name, "reference": reference or f"image:{image}", "envVars": _pairs(env, "--env"),
                  "labels": _pairs(label, "--label"), "annotations": _pairs(annotation, "--annotation"),
                  "secrets": secret, "limits": {"memory": memory, "cpu": cpu}}
    if timeout is not None:
        body["timeout"] = timeout
    if concurrency is not None:
        body["concurrency"] = concurrency
    scaling: dict = {k: v for k, v in (("min", scale_min), ("max", scale_max)) if v is not None}
    try:
        if idle is not None:
            scaling.update(zero_after_s=duration_s(idle), min=scaling.get("min", 0))
        if policy is not None:
            if policy.endswith(MODEL_SUFFIXES):
                _fail("--policy: a function's policy is a name the controller knows (ppo, kpa, ...), not a model file")
            scaling["policy"] = canonical(policy, auto=True, off=True)
        if scaling:
            body["scaling"] = scaling
        return read_deployment(body).model_dump(exclude_defaults=True)
    except PolicyNameError as exc:
        _fail(f"--policy: {exc}")
    except DeployBodyError as exc:
        _fail(str(exc))


def deploy(
    name: Optional[str] = typer.Argument(None, help="The function's name (or -f for a stack file's functions)."),
    reference: Optional[str] = typer.Option(None, "--ref", help="A Python function: package.module:callable."),
    image: Optional[str] = typer.Option(None, "--image", help="A container image (the OpenFaaS watchdog convention)."),
    env: list[str] = typer.Option([], "--env", "-e", help="NAME=VALUE in the function's environment (repeatable)."),
    label: list[str] = typer.Option([], "--label", "-l", help="NAME=VALUE label (repeatable)."),
    annotation: list[str] = typer.Option([], "--annotation", help="NAME=VALUE annotation (repeatable)."),
    secret: list[str] = typer.Option([], "--secret", help="A secret it reads with functions.secret(NAME) (repeatable; `p2pfaas secret create` makes it)."),
    memory: Optional[str] = typer.Option(None, "--memory-limit", help="Memory of one worker (a container's, or a worker process's data), e.g. 256Mi."),
    cpu: Optional[str] = typer.Option(None, "--cpu-limit", help="CPUs of its container, e.g. 500m or 0.5 (image functions, or --runtime docker)."),
    timeout: Optional[str] = typer.Option(None, "--timeout", help="Its time limit, e.g. 30s or 2m (default: its code's, 30 s)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, max=1024, help="Calls one worker runs at once (default: its code's)."),
    scale_min: Optional[int] = typer.Option(None, "--min", min=0, max=256, help="Fewest workers of its own pool (0: scales to zero)."),
    scale_max: Optional[int] = typer.Option(None, "--max", min=1, max=256, help="Most workers of its own pool (default 16)."),
    idle: Optional[str] = typer.Option(None, "--scale-to-zero-after", help="Scale to zero after this long without a call, e.g. 60s (implies --min 0)."),
    policy: Optional[str] = typer.Option(None, "--policy", help="The policy the controller scales its pool with (default kpa; off: none)."),
    stack_file: Optional[Path] = typer.Option(None, "-f", "--yaml", help="Deploy every function of this stack file."),
    node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
) -> None:
    """Deploy a function on every node (or update it); returns once every node that is up runs it.
    --min/--max/--scale-to-zero-after/--policy, --secret or a limit give it a pool of its own."""
    if stack_file is not None:
        if name or reference or image or env or label or annotation or secret:
            _fail("-f deploys what the stack file says: give no name, --ref, --image, --env or --label with it")
        wanted = _stack_functions(stack_file)
    else:
        if not name or bool(reference) == bool(image):
            _fail("give the function's name and --ref module:callable or --image IMAGE (one of them), or -f FILE")
        wanted = [_flags_deployment(name, reference, image, env, label, annotation, secret, memory, cpu, timeout,
                                    concurrency, scale_min, scale_max, idle, policy)]

    async def work(nc, subjects):
        done = []
        for body in wanted:
            await _ask(nc, subjects, node, "deploy", body)
            done.append((body["service"], *await _converged(nc, subjects, body["service"], True)))
        return done

    with _reported(FunctionsError):
        done = _run(data_dir, nats_url, prefix, work)
    for service, agreed, late in done:
        _say_converged("deployed", service, agreed, late)
    if any(late for _, _, late in done):
        raise typer.Exit(1)


def remove(
    name: str = typer.Argument(..., help="The function to remove."),
    node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
) -> None:
    """Remove a deployed function from every node; returns once every node that is up has."""
    async def work(nc, subjects):
        await _ask(nc, subjects, node, "delete", {"service": name})
        return await _converged(nc, subjects, name, False)

    with _reported(FunctionsError):
        agreed, late = _run(data_dir, nats_url, prefix, work)
    _say_converged("removed", name, agreed, late)
    if late:
        raise typer.Exit(1)


def list_functions(
    json_out: bool = typer.Option(False, "--json", help="OpenFaaS's JSON instead of the table."),
    node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
) -> None:
    """The functions, as a node has them: replicas, invocations, where each comes from."""
    from rich.console import Console
    from rich.table import Table

    with _reported(FunctionsError):
        functions = _run(data_dir, nats_url, prefix, lambda nc, subjects: _ask(nc, subjects, node, "list", {}))
    if json_out:
        print(orjson.dumps(functions, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table(box=None, padding=(0, 2, 0, 0), show_edge=False)
    for header in ("function", "invocations", "replicas", "deployed", "image or reference"):
        table.add_column(header, no_wrap=header != "image or reference", overflow="fold",
                         justify="right" if header in ("invocations", "replicas") else "left")
    for f in functions:
        table.add_row(f["name"], str(f["invocationCount"]), f"{f['availableReplicas']}/{f['replicas']}",
                      f["labels"].get("p2pfaas.deployed", "-"),
                      f["envProcess"] or f["image"])
    Console().print(table)


def describe(
    name: str = typer.Argument(..., help="The function."),
    node: str = Node, nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
) -> None:
    """One function: its image or reference, environment, labels, annotations and replicas."""
    with _reported(FunctionsError):
        functions = _run(data_dir, nats_url, prefix, lambda nc, subjects: _ask(nc, subjects, node, "list", {}))
    found = next((f for f in functions if f["name"] == name), None)
    if found is None:
        _fail(f"no function {name!r} on {node} (`p2pfaas list` shows them)")
    lines = [f"name         {found['name']}",
             f"image        {found['image']}" if found["image"] != "p2pfaas" else f"reference    {found['envProcess']}",
             f"replicas     {found['availableReplicas']} ready of {found['replicas']}",
             f"invocations  {found['invocationCount']} (on {node})"]
    lines.append(f"secrets      {', '.join(found.get('secrets') or []) or '-'}")
    limits = found.get("limits") or {}
    lines.append(f"limits       {', '.join(f'{k} {v}' for k, v in sorted(limits.items())) or '-'}")
    for title, key in (("environment", "envVars"), ("labels", "labels"), ("annotations", "annotations")):
        lines.append(title if found.get(key) else f"{title:<12} -")
        lines += [f"  {k}={v}" for k, v in sorted(found.get(key, {}).items())]
    print("\n".join(lines))


def logs(
    name: str = typer.Argument(..., help="The function."),
    tail: int = typer.Option(100, "--tail", min=0, help="The last lines of each node's log to show first (0: none)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Go on printing new lines until Ctrl-C."),
    data_dir: Path = DataDir,
) -> None:
    """What a function printed, from every node's log of the `up` in --data-dir."""
    from functions.output import tag

    logs_dir = data_dir / "logs"
    marker = tag(name)
    if not logs_dir.is_dir():
        _fail(f"no logs in {logs_dir}: is --data-dir the one `p2pfaas up` runs on?")
    files = sorted(logs_dir.glob("node-*.log"))
    if not files:
        _fail(f"no node logs in {logs_dir}")
    width = max(len(f.stem) for f in files)
    offsets = {}
    for path in files:
        with path.open("rb") as log_file:
            lines = [line for line in log_file.read().decode(errors="replace").splitlines() if marker in line]
            offsets[path] = log_file.tell()
        for line in lines[len(lines) - tail:] if tail else []:
            print(f"{path.stem:<{width}}  {line}", flush=True)
    try:
        while follow:
            time.sleep(0.5)
            for path in sorted(logs_dir.glob("node-*.log")):
                with path.open("rb") as log_file:
                    log_file.seek(offsets.get(path, 0))
                    chunk = log_file.read()
                    end = chunk.rfind(b"\n") + 1   # whole lines only: the rest next time
                    offsets[path] = offsets.get(path, 0) + end
                for line in chunk[:end].decode(errors="replace").splitlines():
                    if marker in line:
                        print(f"{path.stem:<{width}}  {line}", flush=True)
    except KeyboardInterrupt:
        pass
