"""Secrets handed to a process when it starts, never through its environment.

``/proc/<pid>/environ`` shows a process's *initial* environment for its whole life (removing a
variable from ``os.environ`` does not change it), to anyone allowed to read it. So a parent
(``up``, a node starting its workers or its bridge's other processes) writes a child's secrets
to an anonymous memory file (memfd), hands the child only its descriptor and names its number in
``P2PFAAS_HANDOFF_FD``; the child reads it once at its start (:func:`take`) and closes it.

A secret exported by a person who runs a part by hand (``P2PFAAS_NATS_PASSWORD=... p2pfaas
node``) is taken the same way: moved out of ``os.environ`` into this process's memory, so the
children it starts never get it. Every process that holds secrets also makes itself not
dumpable: its ``/proc/<pid>/{environ,mem,fd,...}`` then belong to root and other processes of
its user may not read or ptrace it (docs/security.md).
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Mapping

import orjson

log = logging.getLogger(__name__)

HANDOFF_FD_ENV = "P2PFAAS_HANDOFF_FD"
# what never goes to a child's environment, and is taken out of ours
SECRET_NAMES = frozenset({
    "P2PFAAS_NATS_USER", "P2PFAAS_NATS_PASSWORD",
    "P2PFAAS_WORKER_NATS_USER", "P2PFAAS_WORKER_NATS_PASSWORD",
    "P2PFAAS_BRIDGE_NATS_USER", "P2PFAAS_BRIDGE_NATS_PASSWORD",
    "P2PFAAS_MQTT_USER", "P2PFAAS_MQTT_PASSWORD",
    "P2PFAAS_OPERATOR_TOKEN", "P2PFAAS_INVOKE_TOKEN",
    "P2PFAAS_SECRETS_KEY",          # the key of the deployment's secrets (broker/secrets.py)
    "P2PFAAS_FUNCTION_SECRETS",     # a function pool's worker: its function's secrets (JSON)
})
FUNCTION_SECRETS = "P2PFAAS_FUNCTION_SECRETS"
PR_SET_DUMPABLE = 4

_held: dict[str, str] = {}


def take() -> None:
    """At the start of a process that holds secrets: make it not dumpable, read what its parent
    handed it, and move any secret of its environment into its memory."""
    not_dumpable()
    fd = os.environ.pop(HANDOFF_FD_ENV, None)
    if fd:
        _held.update(_read_handoff(int(fd)))
    for name in SECRET_NAMES:
        value = os.environ.pop(name, None)
        if value and name not in _held:
            _held[name] = value


def _read_handoff(fd: int) -> dict[str, str]:
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    values = orjson.loads(b"".join(chunks))
    if not isinstance(values, dict):
        raise ValueError(f"the handoff on descriptor {fd} is not a JSON object")
    return {str(k): str(v) for k, v in values.items()}


def get(name: str) -> str | None:
    """A handed value, else the environment's (a process that did not :func:`take`, e.g. a node
    a test runs in its own process)."""
    return _held.get(name) or os.environ.get(name) or None


def hold(**values: str) -> None:
    """Keep these values as if they had been handed to us (e.g. a stack's identity found in its
    data dir by a part run by hand)."""
    _held.update(values)


def handoff_fd(values: Mapping[str, str]) -> int:
    """A descriptor to hand a child (``pass_fds``) holding ``values``, read from its start. Not
    inheritable: only a child that is passed it gets it. The caller closes it once the child
    has started."""
    fd = os.memfd_create("p2pfaas-handoff", os.MFD_CLOEXEC)
    try:
        data = orjson.dumps(dict(values))
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): our /proc files become root's, and processes of our own user can
    no longer read our environment or memory, nor ptrace us. Reset by execve, so every process
    that holds secrets calls it itself."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:   # not Linux
        log.warning("cannot make this process non-dumpable: %s", exc)
