"""Secrets handed to a process when it starts, never through its environment (``/proc/<pid>/environ`` keeps
the initial one for life): a memfd named by ``P2PFAAS_HANDOFF_FD``, read once by :func:`take`."""

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
    """At a secret holder's start: not dumpable, read the handoff, move env secrets into memory."""
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
    """A handed value, else the environment's (a process that did not :func:`take`)."""
    return _held.get(name) or os.environ.get(name) or None


def hold(**values: str) -> None:
    """Keep these values as if they had been handed to us."""
    _held.update(values)


def handoff_fd(values: Mapping[str, str]) -> int:
    """A non-inheritable descriptor holding ``values`` for a child; the caller closes it after start."""
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
    """prctl(PR_SET_DUMPABLE, 0): no reading our memory, no ptrace. Reset by execve."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:   # not Linux
        log.warning("cannot make this process non-dumpable: %s", exc)
