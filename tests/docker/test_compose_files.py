"""The compose files are valid as written (``docker-compose config``, no engine needed): compose.yaml
once `p2pfaas compose init` has made its identities, and the hub and device files of several
hosts (docs/containers.md). The deployment itself runs in test_compose.py (marker compose) and,
for several machines, with the same commands on emulated machines (tests/edge)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compose() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("docker-compose is not installed (apt-get install -y docker-compose; .ci/run does this)")


def config(path: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*compose(), "-f", str(path), "config"], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin:/usr/local/bin", **env})


def test_compose_yaml_needs_and_takes_its_identities(tmp_path):
    shutil.copy(ROOT / "compose.yaml", tmp_path / "compose.yaml")
    shutil.copytree(ROOT / "compose", tmp_path / "compose", ignore=shutil.ignore_patterns("secrets", "accounts.conf"))
    missing = config(tmp_path / "compose.yaml", tmp_path)
    assert missing.returncode != 0 and "secrets" in (missing.stderr + missing.stdout)   # nothing starts without them
    init = subprocess.run([sys.executable, "-m", "p2pfaas.cli", "compose", "init", "--dir", str(tmp_path),
                           "--device", "sensor1"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert init.returncode == 0, init.stderr
    done = config(tmp_path / "compose.yaml", tmp_path)
    assert done.returncode == 0, done.stderr
    services = _services(done.stdout)
    expected = {"n1": "node-n1", "n2": "node-n2", "n3": "node-n3", "http-n1": "bridge", "http-n2": "bridge",
                "http-n3": "bridge", "mqtt-bridge": "bridge", "controller": "controller"}
    for service, user in expected.items():   # every NATS client of the deployment has its identity
        assert f"P2PFAAS_NATS_USER: {user}" in services[service], (service, services[service][:600])
    node_env = (tmp_path / "compose/secrets/node-n1.env").read_text()
    assert "P2PFAAS_NATS_USER=node-n1" in node_env and "P2PFAAS_WORKER_NATS_USER=worker-n1" in node_env
    accounts = (tmp_path / "compose/nats/accounts.conf").read_text()
    assert '"user": "node-n1"' in accounts and "no_auth_user" not in accounts
    assert node_env.split("P2PFAAS_NATS_PASSWORD=")[1].split()[0] not in accounts   # hashes only
    assert "sensor1:" in (tmp_path / "compose/secrets/mosquitto.env").read_text()
    assert oct((tmp_path / "compose/secrets").stat().st_mode)[-3:] == "700"


def test_the_container_workers_override_runs_each_node_with_docker_workers(tmp_path):
    """compose/containers.yaml on top of compose.yaml: each node with --runtime docker, the engine's
    socket, the network its workers join by name."""
    shutil.copy(ROOT / "compose.yaml", tmp_path / "compose.yaml")
    shutil.copytree(ROOT / "compose", tmp_path / "compose", ignore=shutil.ignore_patterns("secrets", "accounts.conf"))
    init = subprocess.run([sys.executable, "-m", "p2pfaas.cli", "compose", "init", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert init.returncode == 0, init.stderr
    done = subprocess.run([*compose(), "-f", str(tmp_path / "compose.yaml"), "-f",
                           str(tmp_path / "compose/containers.yaml"), "config"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin:/usr/local/bin",
                                                         "P2PFAAS_NETWORK": "p2pfaas-test", "DOCKER_GID": "123"})
    assert done.returncode == 0, done.stderr
    services = _services(done.stdout)
    for node in ("n1", "n2", "n3"):
        block = services[node]
        assert "- --runtime\n    - docker" in block and "- p2pfaas-test" in block, block
        assert "/var/run/docker.sock:/var/run/docker.sock" in block and "n" + node[1] + "-data:/data" in block
        assert "'123'" in block   # group_add: the socket's group
    assert "name: p2pfaas-test" in ("\n" + done.stdout).split("\nnetworks:\n", 1)[1].split("\nservices:")[0]


def _services(rendered: str) -> dict[str, str]:
    """``docker-compose config``'s output, cut into each service's block."""
    body = ("\n" + rendered).split("\nservices:\n", 1)[1].split("\nvolumes:\n", 1)[0]
    blocks: dict[str, str] = {}
    name = None
    for line in body.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.endswith(":"):
            name = line.strip()[:-1]
            blocks[name] = ""
        elif name is not None:
            blocks[name] += line + "\n"
    return blocks


def test_the_several_hosts_files_are_valid(tmp_path):
    invitation = tmp_path / "pi1.invite"
    invitation.write_text("{}")
    hub = config(ROOT / "compose/edge/hub.yaml", tmp_path, P2PFAAS_HUB_NAME="192.0.2.10")
    assert hub.returncode == 0, hub.stderr
    assert "192.0.2.10" in hub.stdout and "7422" in hub.stdout
    device = config(ROOT / "compose/edge/device.yaml", tmp_path, P2PFAAS_INVITATION=str(invitation),
                    P2PFAAS_DEVICE_ADDRESS="192.0.2.21")
    assert device.returncode == 0, device.stderr
    assert "network_mode: host" in device.stdout and "join" in device.stdout
    unset = config(ROOT / "compose/edge/device.yaml", tmp_path)
    assert unset.returncode != 0   # the invitation and the address are required, never defaulted
