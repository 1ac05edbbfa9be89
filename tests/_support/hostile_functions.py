"""A hostile function: run in a worker, it tries every way we know to its node's secrets and
returns what it found (tests/p2pfaas/test_worker_secrets.py). It is given the data dir's file
names (an attacker may know the layout) but none of the secrets.

Tried: its own environment (``os.environ`` and ``/proc/self/environ``); for every process it can
see, its ancestors first, ``/proc/<pid>/{environ,cmdline,mem,fd/*,cwd,root}``; every file of the
data dir, directly and through each ancestor's ``cwd`` and ``root`` links; its own descriptors
(what each is, and what reading it gives).
"""

from __future__ import annotations

import base64
import os
import stat

import orjson

KEEP = 4096   # bytes kept of what is read: every secret is far shorter; a readable thing fails the test anyway


def _try(what: dict, key: str, read) -> None:
    try:
        data = read()
    except Exception as exc:   # what stopped it is part of the report
        what[key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    else:
        what[key] = {"ok": True, "data": base64.b64encode(data[:KEEP]).decode()}


def _read(path: str, size: int = 1 << 20) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def _read_mem(pid: int) -> bytes:
    """The first readable mapping of a process's memory (its stack and heap hold its secrets)."""
    maps = _read(f"/proc/{pid}/maps").decode().splitlines()
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for line in maps:
            span, perms = line.split()[:2]
            if perms.startswith("r"):
                start, end = (int(x, 16) for x in span.split("-"))
                try:
                    return os.pread(fd, min(end - start, KEEP), start)
                except OSError:
                    continue
        return b""
    finally:
        os.close(fd)


def _ancestors() -> list[int]:
    chain, pid = [], os.getpid()
    while pid > 1:
        stat_line = open(f"/proc/{pid}/stat", "rb").read()
        pid = int(stat_line.rsplit(b")", 1)[1].split()[1])
        if pid > 0:
            chain.append(pid)
    return chain


def _process(pid: int, data_files: list[str], ancestor: bool) -> dict:
    out: dict = {}
    for name in ("environ", "cmdline", *(("status",) if ancestor else ())):   # status is public: kept short
        _try(out, name, lambda: _read(f"/proc/{pid}/{name}"))
    _try(out, "mem", lambda: _read_mem(pid))
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        out["fds"] = {"ok": True, "data": fds}
    except OSError as exc:
        out["fds"] = {"ok": False, "error": str(exc)}
        fds = []
    for fd in fds:
        _try(out, f"fd/{fd}", lambda: _read(f"/proc/{pid}/fd/{fd}", KEEP))
    for link in ("cwd", "root"):
        _try(out, f"{link}/", lambda: "\0".join(os.listdir(f"/proc/{pid}/{link}")).encode())
    for path in data_files:
        relative = path.lstrip("/")
        _try(out, f"root/{relative}", lambda: _read(f"/proc/{pid}/root/{relative}"))
        _try(out, f"cwd/{relative}", lambda: _read(f"/proc/{pid}/cwd/{relative}"))   # an absolute path's tail: tried anyway
    return out


def probe(payload: bytes) -> bytes:
    ask = orjson.loads(payload)
    data_files: list[str] = ask["files"]
    report: dict = {"ran": True, "pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
    report["environ"] = dict(os.environ)
    _try(report, "self/environ", lambda: _read("/proc/self/environ"))
    own_fds = {}
    for fd in os.listdir("/proc/self/fd"):
        entry: dict = {}
        try:
            entry["target"] = os.readlink(f"/proc/self/fd/{fd}")
            entry["mode"] = stat.filemode(os.fstat(int(fd)).st_mode)
        except OSError as exc:
            entry["target"] = f"? {exc}"
        if int(fd) > 2:   # 0 and 1 are the node's pipes: reading 0 would take its end-of-file watch
            _try(entry, "read", lambda: os.pread(int(fd), KEEP, 0))
            _try(entry, "reopen", lambda: _read(f"/proc/self/fd/{fd}", KEEP))
        own_fds[fd] = entry
    report["own_fds"] = own_fds
    report["files"] = {}
    for path in data_files:
        _try(report["files"], path, lambda: _read(path))
    walked = []
    for root, dirs, files in os.walk(ask["data_dir"]):
        walked += [os.path.join(root, f) for f in files]
    report["walked"] = walked
    for path in walked:
        if path not in report["files"]:
            _try(report["files"], path, lambda: _read(path))
    report["ancestors"] = ancestors = _ancestors()
    report["processes"] = {}
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in [*ancestors, *sorted(set(pids) - set(ancestors))]:
        if pid != os.getpid():
            mine = pid in ancestors
            report["processes"][str(pid)] = _process(pid, data_files if mine else [], mine)
    return orjson.dumps(report)
