"""Images built from this checkout: the worker image is small and unprivileged, its requirements
match pyproject.toml, and `p2pfaas image build` works (and fails clearly without an engine)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from stack_processes import alive
from typer.testing import CliRunner

from p2pfaas import images
from p2pfaas.cli import app

ROOT = Path(__file__).resolve().parents[2]


def requirement_name(line: str) -> str:
    return re.split(r"[<>=!~ \[]", line.strip(), maxsplit=1)[0].lower()


def test_worker_requirements_are_pyproject_dependencies_with_the_same_bounds():
    declared = {requirement_name(d): d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    lines = [l for l in (ROOT / "docker/worker-requirements.txt").read_text().splitlines() if l and not l.startswith("#")]
    assert lines
    for line in lines:
        assert declared.get(requirement_name(line)) == line, f"{line!r} differs from pyproject.toml"


def test_the_worker_imports_only_its_requirements():
    """The worker image has only docker/worker-requirements.txt: ``nodes.worker`` must import with
    every other dependency of the project missing (no engine needed to find that out)."""
    absent = ["prometheus_client", "torch", "numpy", "fastapi", "starlette", "uvicorn", "httpx", "gymnasium",
              "rich", "typer", "paho", "yaml", "matplotlib", "stable_baselines3"]
    code = ("import sys\n"
            "class Absent:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.split('.')[0] in {absent!r}: raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Absent())\n"
            "import nodes.worker\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_worker_image_has_no_torch_and_runs_unprivileged(docker_client, worker_image):
    out = docker_client.containers.run(worker_image, entrypoint=["python", "-c",
                                       "import os, importlib.util as u, nodes.worker; print(os.getuid(), u.find_spec('torch'))"],
                                       remove=True)
    uid, torch = out.decode().split()
    assert uid != "0" and torch == "None"


def test_image_build_cli_builds_the_example_function(docker_client, base_image):
    result = CliRunner().invoke(app, ["image", "build", "--target", "function", "--base", base_image])
    assert result.exit_code == 0, result.output
    ref = result.stdout.strip().splitlines()[-1]
    assert ref.startswith("p2pfaas-fn-wordcount:")
    assert "p2pfaas-fn-wordcount:latest" in docker_client.images.get(ref).tags


def test_image_build_cli_without_an_engine_says_so(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = CliRunner().invoke(app, ["image", "build"])
    assert result.exit_code == 2
    assert "no Docker engine at unix:///nonexistent/docker.sock" in result.output


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs as debootstrap mounts /proc: needs root")
def test_a_debootstrap_cut_off_is_stopped_and_leaves_nothing_mounted(tmp_path):
    """Past its bound (or interrupted), the base-image build stops debootstrap and unmounts what it
    mounted in the rootfs, so its temporary directory can be removed; the caller gets the reason."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "proc").mkdir(parents=True)
    pids = tmp_path / "pids"
    script = f"echo $$ > {pids}; mount -t tmpfs none {rootfs}/proc && sleep 60 & echo $! >> {pids}; wait"
    with pytest.raises(RuntimeError, match="took longer than 1 s"):
        images._debootstrap(["sh", "-c", script], rootfs, timeout_s=1)
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        assert not [line for line in mounts if str(rootfs) in line]
    for pid in map(int, pids.read_text().split()):   # the command and its child: the whole group
        assert not alive(pid)   # a killed orphan may stay a zombie until init reaps it
    shutil.rmtree(rootfs)


def test_a_failed_debootstrap_says_why(tmp_path):
    with pytest.raises(RuntimeError, match=r"debootstrap failed \(3\): no mirror"):
        images._debootstrap(["sh", "-c", "echo no mirror; exit 3"], tmp_path / "rootfs", timeout_s=30)
