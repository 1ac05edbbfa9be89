"""P2PFaaS's own benchmark client (experiments/benchmark-go), built from its stored source,
unmodified (importable as ``p2pfaas_client``): the compat tests and the edge test run it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ORIGINAL_REPO = Path(os.environ.get("P2PFAAS_ORIGINAL_REPO", "/work/.mirror/shahsneh172000+p2pfaas/repo"))
SQLITE3DUMP_REPO = Path(os.environ.get("P2PFAAS_SQLITE3DUMP_REPO", "/work/.mirror/schollz+sqlite3dump/repo"))
GOCODE = Path("/usr/share/gocode/src")


def build_benchmark_client(out: Path) -> Path:
    """go build of experiments/benchmark-go from the stored source; its three modules come from
    Debian (go-sqlite3, go-logging) and the stored sqlite3dump v1.3.1, vendored into the build copy."""
    missing = [what for what, ok in (
        ("go (apt-get install golang-go)", shutil.which("go")),
        ("Debian's golang-github-mattn-go-sqlite3-dev", (GOCODE / "github.com/mattn/go-sqlite3").is_dir()),
        ("Debian's golang-github-op-go-logging-dev", (GOCODE / "github.com/op/go-logging").is_dir()),
        (f"P2PFaaS's source ({ORIGINAL_REPO})", ORIGINAL_REPO.is_dir()),
        (f"sqlite3dump's source ({SQLITE3DUMP_REPO})", SQLITE3DUMP_REPO.is_dir()),
    ) if not ok]
    if missing:
        pytest.skip("cannot build P2PFaaS's benchmark client: missing " + ", ".join(missing))
    src = out / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ORIGINAL_REPO), "archive", "HEAD", "experiments/benchmark-go"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    module = src / "experiments/benchmark-go/src/benchmark"
    vendor = module / "vendor/github.com"
    for name in ("mattn/go-sqlite3", "op/go-logging"):
        shutil.copytree(GOCODE / "github.com" / name, vendor / name)
    (vendor / "schollz/sqlite3dump").mkdir(parents=True)
    dump = subprocess.run(["git", "-C", str(SQLITE3DUMP_REPO), "archive", "v1.3.1"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(vendor / "schollz/sqlite3dump")], input=dump, check=True)
    (module / "vendor/modules.txt").write_text(
        "# github.com/mattn/go-sqlite3 v1.14.12\n## explicit; go 1.12\ngithub.com/mattn/go-sqlite3\n"
        "# github.com/op/go-logging v0.0.0-20160315200505-970db520ece7\n## explicit\ngithub.com/op/go-logging\n"
        "# github.com/schollz/sqlite3dump v1.3.1\n## explicit; go 1.16\ngithub.com/schollz/sqlite3dump\n")
    cache = Path.home() / ".cache/p2pfaas/go-build"
    env = {**os.environ, "GOFLAGS": "-mod=vendor", "GOPROXY": "off", "GOCACHE": str(cache), "GOPATH": str(out / "gopath")}
    binary = out / "benchmark"
    subprocess.run(["nice", "-n", "10", "go", "build", "-o", str(binary), "."], cwd=module, env=env, check=True,
                   capture_output=True, timeout=300)
    shutil.copytree(src / "experiments/benchmark-go/scripts/blobs", out / "blobs")
    return binary


def documented_command_line(benchmark: Path) -> list[str]:
    """scripts/bench_mix_payloads.sh, unchanged; the appended -benchmark-time (Go's flag package
    takes the last value) shortens its hour to seconds."""
    return [str(benchmark), "-hosts-file", "./hosts.txt", "-function-name", "fn-pigo", "-dir-payloads", "./blobs",
            "-payloads", "familyr_320p.jpg,familyr_100p.jpg", "-payloads-mix-percentages", "0.30,0.70",
            "-lambdas", "4,6,8,12,13,14,15,16,17,18,19,20", "-benchmark-time", "3600", "-dir-log", "./log",
            "-traffic-model-type", "static", "-learning-reward-deadlines", "0.194,0.045", "-learning-set-reward",
            "-learning-batch-size", "20", "-learning"]
