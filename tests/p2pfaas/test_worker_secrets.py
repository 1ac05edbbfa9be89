"""A function that wants its node's secrets (issue 25): deployed on a real ``p2pfaas up`` (TLS,
Mosquitto, an invoke token, two HTTP bridge processes, a device), it tries every way we know from
inside its worker (tests/_support/hostile_functions.py) and must find none of them -- the
environment of itself and of every process it can see (its ancestors first), their memory and
descriptors, every file of the data dir, and its own descriptors -- under each kind of worker
nodes/sandbox.py makes: what a root ``up`` picks by itself, ``nobody``, and the user who runs ``up``
(Landlock). Each run checks the function did run, so a test that cannot reach it fails."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import httpx
import orjson
import pytest

from broker.auth import AuthStore
from broker.embedded import free_port
from broker.handoff import SECRET_NAMES
from nodes.sandbox import blocked, landlock_abi, resolve_user
from stack_processes import descendants, wait_endpoints

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "_support"
NOBODY, NOGROUP, _ = resolve_user("nobody")
ROOT_ONLY = os.geteuid() == 0


def nobody_python() -> tuple[str, dict[str, str]] | None:
    """An interpreter nobody can run with this project's packages: ours, else the system's of the
    same version given our site-packages (a Python under /root is out of nobody's reach)."""
    env = {"PYTHONPATH": os.pathsep.join([str(SUPPORT), str(ROOT), sysconfig.get_paths()["purelib"]])}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if not os.path.exists(python) or blocked(python, NOBODY, {NOGROUP}, execute=True):
            continue
        try:
            done = subprocess.run([python, "-c", "import nats, orjson, pydantic, uvloop, p2pfaas.cli, hostile_functions"],
                                  env={**os.environ, **env}, user=NOBODY, group=NOGROUP, extra_groups=[],
                                  cwd="/", capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return python, env
    return None


def secrets_of(data_dir: Path) -> set[str]:
    """Every password and token under auth/ and every line of every private key under tls/."""
    found: set[str] = set()

    def strings(value) -> None:
        if isinstance(value, str) and len(value) >= 16:
            found.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                strings(v)
        elif isinstance(value, list):
            for v in value:
                strings(v)

    for path in (data_dir / "auth").iterdir():
        text = path.read_text()
        try:
            strings(orjson.loads(text))
        except orjson.JSONDecodeError:
            strings(text.strip())
    for path in (data_dir / "tls").iterdir():
        text = path.read_text()
        if "PRIVATE KEY" in text:
            found.update(line for line in text.splitlines() if len(line) >= 32 and "PRIVATE KEY" not in line)
    return found


def haystack(value) -> bytes:
    """Everything the probe brought back, what it read decoded."""
    if isinstance(value, dict):
        if value.get("ok") is True and isinstance(value.get("data"), str):
            return base64.b64decode(value["data"]) + b"\n" + b"\n".join(haystack(v) for k, v in value.items() if k != "data")
        return b"\n".join(haystack(k) + b"=" + haystack(v) for k, v in value.items())
    if isinstance(value, list):
        return b"\n".join(haystack(v) for v in value)
    return str(value).encode()


def fd_targets(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def probe_stack(start_up, data_dir: Path, *extra: str, python: str = sys.executable, env: dict | None = None,
                user: int | None = None) -> tuple[dict, int]:
    """Start the stack, run the hostile function once, check what it brought back; the report and
    the worker's pid."""
    store = AuthStore(data_dir / "auth")
    store.device("dev1")   # a device's password too (Mosquitto's password file holds its hash)
    if user is not None:
        shutil.chown(data_dir, user, NOGROUP)
        for path in data_dir.rglob("*"):
            shutil.chown(path, user, NOGROUP)
    base_env = {"PYTHONPATH": f"{SUPPORT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = start_up(data_dir, "--tls", "--mqtt", "mosquitto", "--mqtt-port", str(free_port()), "--nats-port",
                    str(free_port()), "--http-port", str(free_port()), "--controller", "off", "--require-invoke-token",
                    "--http-processes", "2", "-f", "probe=hostile_functions:probe", *extra,
                    env={**base_env, **(env or {})}, python=python, user=user)
    endpoints = wait_endpoints(proc, data_dir, timeout_s=120)
    files = sorted(str(p) for p in data_dir.rglob("*") if p.is_file())
    assert [p for p in (data_dir / "tls").iterdir() if "PRIVATE KEY" in p.read_text()], "no TLS key to look for"
    secrets = secrets_of(data_dir)
    assert {store.operator_token(), store.invoke_token(), store.node("n1").password, store.worker("n1").password,
            store.service("bridge").password, store.device("dev1").password} <= secrets

    answer = httpx.post(f"{endpoints['http']['n1']}/function/probe",
                        content=orjson.dumps({"files": files, "data_dir": str(data_dir)}),
                        headers={"Authorization": f"Bearer {store.invoke_token()}"},
                        verify=str(data_dir / "tls" / "ca.pem"), timeout=90)
    assert answer.status_code == 200, answer.text
    report = orjson.loads(answer.content)

    # it ran, in one of this node's workers, and looked where it should
    workers = {int(p.read_text().split()[0]) for p in (data_dir / "nodes" / "n1" / "run" / "workers").glob("*.pid")}
    worker = report["pid"]
    assert report["ran"] and worker in workers, (worker, workers)
    node = int((data_dir / "run" / "node-n1.pid").read_text().split()[0])
    up = proc.pid
    assert report["ancestors"][:2] == [node, up], report["ancestors"]
    assert len(report["files"]) >= len(files) and report["processes"][str(node)]["cmdline"]["ok"]

    # no secret anywhere in what it brought back
    found = haystack(report)
    leaked = sorted(s[:8] + "..." for s in secrets if s.encode() in found)
    assert not leaked, f"the function read {len(leaked)} secret(s): {leaked}"
    assert not SECRET_NAMES & report["environ"].keys(), report["environ"].keys()

    # nor could it read any file of the data dir, or the environment, memory or descriptors of the stack's processes
    readable = [path for path, got in report["files"].items() if got["ok"]]
    assert not readable, f"the function read {readable}"
    stack = (descendants(up) | {up}) - {worker}
    for pid in sorted(stack & {int(p) for p in report["processes"]}):
        seen = report["processes"][str(pid)]
        # public: its command line, its status and (to root without capabilities) the numbers of its descriptors
        opened = [what for what, got in seen.items() if got.get("ok") and what not in ("cmdline", "status", "fds")]
        assert not opened, f"the function read {opened} of process {pid} ({seen['cmdline']})"

    # its descriptors: no handoff left, and nothing the node or up hold but its own stdio
    own = report["own_fds"]
    assert not [fd for fd, e in own.items() if "memfd:" in e["target"]], own
    shared = (fd_targets(node) | fd_targets(up)) - {own[fd]["target"] for fd in ("0", "1", "2") if fd in own}
    leaked_fds = {fd: e["target"] for fd, e in own.items() if e["target"] in shared
                  and e["target"].startswith(("socket:", "pipe:", str(data_dir)))}
    assert not leaked_fds, f"the worker holds the node's {leaked_fds}"
    return report, worker


def status_of(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


def test_a_function_reaches_no_secret_of_a_stack_its_user_starts(tmp_path, start_up):
    """``up`` as it is run (as root here, the workers' user chosen by ``auto``): nobody where nobody
    can run the workers, else root without capabilities, which Landlock must then hold."""
    report, worker = probe_stack(start_up, tmp_path)
    status = status_of(worker)
    assert status["NoNewPrivs"].strip() == "1"
    if report["uid"] == 0:
        assert ROOT_ONLY and status["CapEff"].strip() == "0" * 16 and status["CapBnd"].strip() == "0" * 16, status
        assert landlock_abi(), "a worker that stays root is held by Landlock alone"


@pytest.mark.skipif(not ROOT_ONLY, reason="starting workers as another user needs root")
def test_a_function_run_as_nobody_reaches_no_secret(tmp_path, start_up):
    found = nobody_python()
    if found is None:
        pytest.skip("no Python interpreter nobody can run with this project's packages")
    python, env = found
    report, worker = probe_stack(start_up, tmp_path, "--worker-user", "nobody", python=python, env=env)
    assert (report["uid"], report["gid"], report["groups"]) == (NOBODY, NOGROUP, [])
    assert status_of(worker)["NoNewPrivs"].strip() == "1"


@pytest.mark.skipif(not ROOT_ONLY, reason="the test starts up as another user")
def test_a_function_run_as_the_stacks_own_user_reaches_no_secret(start_up):
    """``up`` run by an unprivileged user: its workers run as that user too, and only Landlock (and
    the not-dumpable parts) keep the data dir and the other processes' memory from them."""
    if not landlock_abi():
        pytest.skip("without Landlock a worker of the same user reads the data dir (docs/security.md)")
    found = nobody_python()
    if found is None:
        pytest.skip("no Python interpreter nobody can run with this project's packages")
    python, env = found
    home = Path(tempfile.mkdtemp(prefix="p2pfaas-same-user-", dir="/tmp"))   # pytest's own tmp is root's (0700)
    shutil.chown(home, NOBODY, NOGROUP)
    (home / "data").mkdir()
    try:
        report, _ = probe_stack(start_up, home / "data", python=python, env={**env, "HOME": str(home)}, user=NOBODY)
        assert report["uid"] == NOBODY
    finally:
        start_up.end()
        shutil.rmtree(home, ignore_errors=True)
