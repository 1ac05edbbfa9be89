"""What keeps a worker process, which runs user code, away from its node's secrets
(docs/security.md, "What a function can reach"), applied between fork and exec: another user
(``worker_user``, ``nobody`` by default; ``auto`` keeps root, without capabilities, when it cannot
run Python), Landlock (the data dir hidden, the rest read-only) and no_new_privs."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import pwd
import stat
import struct
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from broker.embedded import die_with_parent_preexec

if TYPE_CHECKING:
    from nodes.settings import NodeSettings

log = logging.getLogger(__name__)

AUTO = "auto"
DEFAULT_WORKER_USER = "nobody"
NOBODY_ID = 65534            # nobody/nogroup where the user database has no such user
RULESET_REFRESH_S = 1.0      # a burst of starts shares one ruleset; entries made later in the data dir's parents get rules after it

# <linux/landlock.h>
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446   # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV   # what a rule on a non-directory may name
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
# <linux/prctl.h>
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4

_libc = ctypes.CDLL(None, use_errno=True)
# looked up now: between fork and exec nothing may be loaded or looked up
_syscall, _prctl = _libc.syscall, _libc.prctl
_syscall.restype = ctypes.c_long


class WorkerUserError(ValueError):
    """The worker user asked for cannot be used (unknown, not root, or it cannot run the worker)."""


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or it is disabled)."""
    abi = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(abi))


def fs_rights(abi: int) -> int:
    """Every file system right this ABI knows (a right it does not know cannot be handled)."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _beneath(path: str, parent: str) -> bool:
    return parent == "/" or path.startswith(parent.rstrip("/") + "/")


def block_devices(root: str = "/dev") -> list[str]:
    """Block devices under ``root``: raw disks hold every file, the data dir's included."""
    found: list[str] = []
    todo = [root]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISBLK(mode):
                found.append(entry.path)
            elif stat.S_ISDIR(mode):
                todo.append(entry.path)
    return found


@dataclass
class LandlockPolicy:
    """Read and execute everywhere, write in ``writable``, nothing in ``hidden``."""

    hidden: list[str]
    writable: list[str]
    abi: int

    def build(self) -> int:
        """A ruleset descriptor (close-on-exec) for :func:`restrict_self`."""
        handled = fs_rights(self.abi)
        scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if self.abi >= 6 else 0
        size = 8 if self.abi < 4 else 16 if self.abi < 6 else 24
        attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0, scoped)[:size], size)
        fd = _syscall(_SYS_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
        try:
            # listing directories everywhere, the data dir's included (its names are no secret):
            # Python's import system must list a directory to find the modules in it
            self._allow(fd, "/", FS_READ_DIR, [])
            hidden = [*self.hidden, *block_devices()]
            for path, rights in [("/", FS_READ), *((p, handled) for p in self.writable)]:
                self._allow(fd, path, rights, hidden)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _allow(self, ruleset: int, path: str, rights: int, hidden: list[str]) -> None:
        """``rights`` beneath ``path`` except beneath the hidden paths: a rule covers all below it, so a
        parent of a hidden path gets none and each of its other entries one (a symlink none)."""
        if path in hidden:
            return
        if any(_beneath(h, path) for h in hidden):
            try:
                entries = list(os.scandir(path))
            except OSError:
                return
            for entry in entries:
                if not entry.is_symlink():
                    self._allow(ruleset, entry.path, rights, hidden)
            return
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= FILE_RIGHTS
            rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
            if _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, ctypes.c_uint32(0)) != 0:
                log.debug("landlock_add_rule %s: %s", path, os.strerror(ctypes.get_errno()))
        finally:
            os.close(fd)


@dataclass
class WorkerSandbox:
    """How a node starts its worker processes. ``uid`` None: as the node's own user."""

    uid: int | None = None
    gid: int | None = None
    groups: list[int] = field(default_factory=list)
    user: str = ""                      # for messages
    drop_caps: bool = False             # a worker that stays root
    landlock: LandlockPolicy | None = None
    notes: list[str] = field(default_factory=list)   # what it does not protect, for the operator
    announced: bool = False             # its notes were logged (one sandbox serves every pool of a node)
    _ruleset: tuple[int, float] | None = field(default=None, repr=False)

    def describe(self) -> str:
        who = f"as {self.user} (uid {self.uid})" if self.uid is not None else (
            "as root without capabilities" if self.drop_caps else f"as the node's user (uid {os.geteuid()})")
        how = f"Landlock ABI {self.landlock.abi}, data dir hidden" if self.landlock else "no Landlock"
        return f"workers run {who}, {how}, no_new_privs"

    def ruleset(self) -> int | None:
        """The Landlock ruleset for the next worker, made again every RULESET_REFRESH_S."""
        if self.landlock is None:
            return None
        now = time.monotonic()
        if self._ruleset is not None and now - self._ruleset[1] < RULESET_REFRESH_S:
            return self._ruleset[0]
        fd = self.landlock.build()
        if self._ruleset is not None:
            os.close(self._ruleset[0])
        self._ruleset = (fd, now)
        return fd

    def preexec(self) -> Callable[[], None]:
        """What the child runs between fork and exec (preexec_fn): nothing there may allocate a
        lock another thread held, so everything is prepared here."""
        uid, gid, groups, drop_caps = self.uid, self.gid, list(self.groups), self.drop_caps
        ruleset = self.ruleset()
        last_cap = _last_cap() if drop_caps else -1

        def enter() -> None:
            die_with_parent_preexec()
            if uid is not None:
                os.setgroups(groups)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            elif drop_caps:   # root with an empty bounding set gets no capability at exec
                for cap in range(last_cap + 1):
                    _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
                _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
            if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
            if ruleset is not None and _syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
                raise OSError(ctypes.get_errno(), "landlock_restrict_self")

        return enter


def _last_cap() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 63


def resolve_user(spec: str) -> tuple[int, int, str]:
    """(uid, gid, name) of a user name or number."""
    try:
        entry = pwd.getpwuid(int(spec)) if spec.isdigit() else pwd.getpwnam(spec)
        return entry.pw_uid, entry.pw_gid, entry.pw_name
    except KeyError:
        if spec.isdigit():
            return int(spec), int(spec), spec
        if spec == DEFAULT_WORKER_USER:
            return NOBODY_ID, NOBODY_ID, spec
        raise WorkerUserError(f"worker user {spec!r}: no such user") from None


def _allows(st: os.stat_result, uid: int, gids: set[int], bits: int) -> bool:
    if st.st_uid == uid:
        mode = st.st_mode >> 6
    elif st.st_gid in gids:
        mode = st.st_mode >> 3
    else:
        mode = st.st_mode
    return mode & bits == bits


def blocked(path: str, uid: int, gids: set[int], *, execute: bool = False) -> str | None:
    """Why ``uid`` may not reach ``path`` (search every directory on the way; read it, or run
    it), or None. File modes only (no ACL): what a typical install needs."""
    real = os.path.realpath(path)
    for way in dict.fromkeys((os.path.abspath(path), real)):   # the directories on the way to a link, and to its target
        parts = Path(way).parts
        for i in range(1, len(parts)):
            prefix = os.path.join(*parts[:i])
            try:
                st = os.stat(prefix)
            except OSError:
                return None   # gone: not ours to judge
            if not _allows(st, uid, gids, 1):
                return f"{prefix} is {stat.filemode(st.st_mode)} {_owner(st)}"
    try:
        st = os.stat(real)
    except OSError:
        return None
    need = 1 if execute else 5 if stat.S_ISDIR(st.st_mode) else 4
    if not _allows(st, uid, gids, need):
        return f"{real} is {stat.filemode(st.st_mode)} {_owner(st)}"
    return None


def _owner(st: os.stat_result) -> str:
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    return f"(owner {user})"


def worker_needs(functions: Iterable[tuple[str, str]], env: dict[str, str]) -> list[tuple[str, bool]]:
    """What a worker process must read (path, executed): the interpreter, its library, the
    standard library, the site-packages, our own code, ``PYTHONPATH`` and the functions' modules."""
    needs: list[tuple[str, bool]] = [(sys.executable, True)]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        lib = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        if lib and sysconfig.get_config_var("LIBDIR"):
            needs.append((os.path.join(sysconfig.get_config_var("LIBDIR"), lib), False))
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            needs.append((paths[key], False))
    needs.append((os.path.join(paths.get("platstdlib", ""), "lib-dynload"), False))
    venv_cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    needs.append((venv_cfg, False))
    needs.append((str(Path(__file__).resolve().parent), False))   # nodes/, and what imports it
    needs += [(p, False) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for _, reference in functions:
        module, sep, _ = reference.partition(":")
        if not sep or reference.startswith("image:"):
            continue
        loaded = sys.modules.get(module)
        origin = getattr(loaded, "__file__", None)
        if origin is None:
            try:
                spec = importlib.util.find_spec(module.split(".")[0])
            except (ImportError, ValueError):
                spec = None
            origin = spec.origin if spec is not None and spec.has_location else None
        if origin:
            needs.append((origin, False))
    return [(p, x) for p, x in needs if os.path.exists(p)]


def _engine_socket_group() -> list[int]:
    """Image functions start containers: their workers need the Docker engine's socket."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return []
    try:
        return [os.stat(host.removeprefix("unix://")).st_gid]
    except OSError:
        return []


def decide(settings: "NodeSettings", env: dict[str, str] | None = None) -> WorkerSandbox:
    """The sandbox of this node's worker processes; WorkerUserError for an unusable ``worker_user``."""
    env = dict(os.environ) if env is None else env
    return _decide(settings.worker_user, str(Path(settings.data_dir).resolve()),
                   tuple(str(Path(p).resolve()) for p in settings.worker_writable),
                   tuple(map(tuple, settings.functions)), env.get("PYTHONPATH", ""), os.environ.get("TMPDIR", ""))


@functools.lru_cache(maxsize=32)
def _decide(worker_user: str, data_dir: str, writable: tuple[str, ...], functions: tuple, pythonpath: str,
            tmpdir: str) -> WorkerSandbox:
    euid = os.geteuid()
    sandbox = WorkerSandbox()
    abi = landlock_abi()
    if worker_user == AUTO:
        target = resolve_user(DEFAULT_WORKER_USER) if euid == 0 else None
    else:
        target = resolve_user(worker_user)
        if target[0] == euid:
            target = None
        elif euid != 0:
            raise WorkerUserError(f"worker user {target[2]}: only a node run as root starts its workers as "
                                  f"another user (this one runs as uid {euid})")
    images = any(r.startswith("image:") for _, r in functions)
    if images:
        sandbox.notes.append("image functions start containers, so their workers get the Docker engine, which is "
                             "root on this machine: they are not kept from the node's secrets")
    if target is not None:
        uid, gid, name = target
        groups = _engine_socket_group() if images else []
        gids = {gid, *groups}
        why = next((f"{name} cannot {'run' if x else 'read'} {p}: {reason}" for p, x in
                    worker_needs(functions, {"PYTHONPATH": pythonpath}) if (reason := blocked(p, uid, gids, execute=x))),
                   None)
        if why is not None:
            if worker_user != AUTO:
                raise WorkerUserError(f"worker user {name}: {why}; make it readable by {name}, or choose "
                                      f"another worker user")
            held = "kept from the data dir by Landlock alone" if abi else "NOT kept from the data dir (no Landlock)"
            sandbox.notes.append(f"workers run as root without capabilities, {held}, not as {name}: {why}. Make that "
                                 f"readable by {name}, or give another --worker-user, to keep functions out of root's files")
            target = None
        else:
            sandbox.uid, sandbox.gid, sandbox.groups, sandbox.user = uid, gid, groups, name
    sandbox.drop_caps = target is None and euid == 0
    if abi:
        writable_dirs = [p for p in ("/tmp", "/var/tmp", "/dev/shm", tmpdir, "/dev", *writable) if p and os.path.isdir(p)]
        sandbox.landlock = LandlockPolicy(hidden=[data_dir], writable=[os.path.realpath(p) for p in writable_dirs],
                                          abi=abi)
    elif target is None:
        sandbox.notes.append("no Landlock on this kernel: workers run as the node's user and can read the data dir "
                             "and the memory of that user's other processes (not the node's own, which is not dumpable)")
    return sandbox
