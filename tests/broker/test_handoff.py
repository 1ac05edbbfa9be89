"""Secrets handed to a child at its start (broker/handoff.py): never in its environment."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from broker.handoff import HANDOFF_FD_ENV, SECRET_NAMES, handoff_fd
from broker.lifecycle import child_env

CHILD = """
import ctypes, orjson, os
from broker import handoff
environ = open('/proc/self/environ', 'rb').read().decode()
handoff.take()
fds = [os.readlink(f'/proc/self/fd/{fd}') for fd in os.listdir('/proc/self/fd') if os.path.exists(f'/proc/self/fd/{fd}')]
print(orjson.dumps({"password": handoff.get("P2PFAAS_NATS_PASSWORD"), "token": handoff.get("P2PFAAS_OPERATOR_TOKEN"),
                    "left": sorted(k for k in os.environ if k.startswith("P2PFAAS_")), "environ": environ, "fds": fds,
                    "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)}).decode())   # PR_GET_DUMPABLE
"""


def run_child(env: dict[str, str], pass_fds=()) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, pass_fds=pass_fds, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return orjson.loads(done.stdout)


def test_a_child_reads_its_secrets_once_from_the_descriptor_it_is_handed():
    fd = handoff_fd({"P2PFAAS_NATS_PASSWORD": "s3cret-handed", "P2PFAAS_OPERATOR_TOKEN": "t0ken-handed"})
    try:
        got = run_child(child_env(**{HANDOFF_FD_ENV: str(fd)}), pass_fds=(fd,))
    finally:
        os.close(fd)
    assert (got["password"], got["token"]) == ("s3cret-handed", "t0ken-handed")
    assert "s3cret-handed" not in got["environ"] and "t0ken-handed" not in got["environ"]
    assert not [t for t in got["fds"] if "memfd:" in t], got["fds"]   # read, then closed
    assert HANDOFF_FD_ENV not in got["left"]
    assert got["dumpable"] == 0   # prctl(PR_GET_DUMPABLE): it holds secrets


def test_secrets_exported_by_hand_are_taken_out_of_the_environment_and_never_inherited(monkeypatch):
    """A person who exports an identity in their shell: the part reads it and drops it from
    os.environ; whatever it starts does not get it."""
    got = run_child({**os.environ, "P2PFAAS_NATS_PASSWORD": "exported"})
    assert got["password"] == "exported" and "P2PFAAS_NATS_PASSWORD" not in got["left"]
    monkeypatch.setenv("P2PFAAS_NATS_PASSWORD", "exported")
    monkeypatch.setenv(HANDOFF_FD_ENV, "99")
    env = child_env(P2PFAAS_NODE_SETTINGS="{}")
    assert not SECRET_NAMES & env.keys() and HANDOFF_FD_ENV not in env and env["P2PFAAS_NODE_SETTINGS"] == "{}"
    with pytest.raises(ValueError, match="handed over"):
        child_env(P2PFAAS_OPERATOR_TOKEN="x")


def test_a_handoff_larger_than_a_pipe_does_not_block_its_writer():
    fd = handoff_fd({"P2PFAAS_TLS_CA_PEM": "x" * (1 << 20)})
    try:
        assert len(os.pread(fd, 2 << 20, 0)) > 1 << 20
    finally:
        os.close(fd)
