"""The P2PFaaS Go original, built and run beside p2pfaas for the side-by-side rows of the benches:
its scheduler (stack-scheduler, v0.3.0b, from its stored source, unmodified) with the bare Go echo
(bench/loadgen/echo) as the OpenFaaS gateway its functions run behind and as its discovery
service (no peers: with NoScheduler every call runs locally).

Its modules come from Debian (gorilla/mux, gorilla/websocket, genny, go-logging) vendored into
the build copy: ``apt-get install -y golang-go golang-github-gorilla-mux-dev
golang-github-gorilla-websocket-dev golang-github-cheekybits-genny-dev golang-github-op-go-logging-dev``
and the mirror of shahsneh172000/p2pfaas. :func:`missing` says what is not there (the benches
skip the rows with that reason). The scheduler listens on 18080 and 16060 (pprof), fixed in its
source: both must be free. It closes every connection after its answer (keep-alive off, in its
source), as users meet it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORIGINAL_REPO = Path(os.environ.get("P2PFAAS_ORIGINAL_REPO", "/work/.mirror/shahsneh172000+p2pfaas/repo"))
GOCODE = Path("/usr/share/gocode/src/github.com")
MODULES = {   # what its go.mod requires -> Debian's copy (mux 1.8 keeps 1.6's API; context is unused then)
    "github.com/cheekybits/genny v1.0.0": "cheekybits/genny",
    "github.com/gorilla/mux v1.6.2": "gorilla/mux",
    "github.com/gorilla/websocket v1.5.0": "gorilla/websocket",
    "github.com/op/go-logging v0.0.0-20160211212156-b2cb9fa56473": "op/go-logging",
}
PORT = 18080
PPROF_PORT = 16060


def missing() -> list[str]:
    """What building or running the original needs and this machine lacks (empty: all there)."""
    out = [what for what, ok in (
        ("go (apt-get install golang-go)", shutil.which("go")),
        (f"P2PFaaS's source ({ORIGINAL_REPO}; the search tool's fetch brings it)", ORIGINAL_REPO.is_dir()),
        *((f"Debian's golang-github-{path.replace('/', '-')}-dev", (GOCODE / path).is_dir()) for path in MODULES.values()),
    ) if not ok]
    for port in (PORT, PPROF_PORT):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                out.append(f"a free port {port} (its source fixes it)")
    return out


def _go_env(work: Path) -> dict[str, str]:
    return {**os.environ, "GOFLAGS": "-mod=vendor", "GOPROXY": "off", "GOCACHE": str(Path.home() / ".cache/p2pfaas/go-build"),
            "GOPATH": str(work / "gopath")}


def build_loadgen(work: Path, name: str) -> Path:
    """bench/loadgen/NAME (one file, standard library only) built under ``work``, offline."""
    binary = work / name
    subprocess.run(["go", "build", "-o", str(binary), str(ROOT / "bench/loadgen" / name / "main.go")], cwd=work,
                   env={**_go_env(work), "GOFLAGS": "-mod=mod"}, check=True, capture_output=True, timeout=300)
    return binary


def build(work: Path) -> tuple[Path, Path]:
    """(the scheduler, the echo) built under ``work``."""
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ORIGINAL_REPO), "archive", "HEAD", "stack-scheduler/src/scheduler"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    module = src / "stack-scheduler/src/scheduler"
    lines = []
    for requirement, path in MODULES.items():
        shutil.copytree(GOCODE / path, module / "vendor/github.com" / path,
                        ignore=shutil.ignore_patterns("*_test.go", "example*", "examples"))
        name = requirement.split()[0]
        packages = [name] + ([f"{name}/generic"] if path == "cheekybits/genny" else [])
        lines += [f"# {requirement}", "## explicit", *packages]
    lines += ["# github.com/gorilla/context v1.1.1", "## explicit"]
    (module / "vendor/modules.txt").write_text("\n".join(lines) + "\n")
    scheduler = work / "p2pfaas-scheduler"
    subprocess.run(["go", "build", "-o", str(scheduler), "."], cwd=module, env=_go_env(work), check=True,
                   capture_output=True, timeout=600)
    return scheduler, build_loadgen(work, "echo")


def start(work: Path, scheduler: Path, echo: Path, echo_port: int, k: int = 64) -> list[subprocess.Popen]:
    """The echo and the scheduler (K slots, NoScheduler: every call local), once both answer."""
    import httpx

    data = work / "data"
    data.mkdir(exist_ok=True)
    procs = [subprocess.Popen([str(echo), "-listen", f"127.0.0.1:{echo_port}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)]
    env = {**os.environ, "P2PFAAS_OPENFAAS_ENABLED": "true", "P2PFAAS_OPENFAAS_HOST": "127.0.0.1",
           "P2PFAAS_OPENFAAS_PORT": str(echo_port), "P2PFAAS_DATA_PATH": str(data),
           "P2PFAAS_SERVICE_DISCOVERY_HOST": "127.0.0.1", "P2PFAAS_SERVICE_DISCOVERY_PORT": str(echo_port),
           "P2PFAAS_SERVICE_LEARNING_HOST": "127.0.0.1"}
    procs.append(subprocess.Popen([str(scheduler)], cwd=work, env=env, stdout=(work / "scheduler.log").open("w"),
                                  stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or procs[1].poll() is not None:
            stop(procs)
            raise RuntimeError(f"the Go original did not start: see {work / 'scheduler.log'}")
        time.sleep(0.2)
    httpx.post(f"http://127.0.0.1:{PORT}/configuration", timeout=5, json={
        "parallel_running_functions_max": k, "queue_length_max": 100, "queue_enabled": True})
    httpx.post(f"http://127.0.0.1:{PORT}/configuration/scheduler", timeout=5,
               json={"name": "NoScheduler", "parameters": ["false"]})
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
