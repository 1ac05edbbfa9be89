"""The worker's sandbox (nodes/sandbox.py), on its own: what Landlock leaves a process, who may
reach a path, and how the workers' user is chosen."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nodes.sandbox import (LandlockPolicy, WorkerSandbox, WorkerUserError, blocked, decide, landlock_abi,
                           resolve_user)
from nodes.settings import NodeSettings

TRY = """
import os, sys
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as exc:
        return type(exc).__name__
data, beside, writable = sys.argv[1:4]
print(attempt(lambda: open(os.path.join(data, "auth", "secret")).read()),
      attempt(lambda: open(os.path.join(beside, "code.py")).read()),
      attempt(lambda: open(os.path.join(writable, "out"), "w").write("x")),
      attempt(lambda: open(os.path.join(beside, "new"), "w").write("x")),
      attempt(lambda: open(f"/proc/{os.getppid()}/environ", "rb").read()),
      attempt(lambda: os.kill(os.getppid(), 0)),
      attempt(lambda: os.listdir(data)))
"""


@pytest.mark.skipif(not landlock_abi(), reason="no Landlock on this kernel")
def test_landlock_hides_the_data_dir_keeps_the_rest_read_only_and_other_processes_out(tmp_path):
    data, beside, writable = tmp_path / "data", tmp_path / "code", tmp_path / "out"
    for d in (data / "auth", beside, writable):
        d.mkdir(parents=True)
    (data / "auth" / "secret").write_text("s3cret")
    (beside / "code.py").write_text("x = 1\n")
    # as a worker: without capabilities (CAP_SYS_PTRACE would get past Landlock's ptrace check)
    sandbox = WorkerSandbox(drop_caps=os.geteuid() == 0,
                            landlock=LandlockPolicy(hidden=[str(data)], writable=[str(writable)], abi=landlock_abi()))
    done = subprocess.run([sys.executable, "-c", TRY, str(data), str(beside), str(writable)], capture_output=True,
                          text=True, preexec_fn=sandbox.preexec(), timeout=60)
    assert done.returncode == 0, done.stderr
    secret, code, write, elsewhere, environ, signal, listing = done.stdout.split()
    assert (secret, code, write, elsewhere, environ) == ("PermissionError", "ok", "ok", "PermissionError", "PermissionError")
    assert listing == "ok"   # names only: Python's import system lists the directories it searches
    if landlock_abi() >= 6:
        assert signal == "PermissionError"


def test_a_path_is_blocked_by_the_first_directory_the_user_may_not_search():
    base = Path(tempfile.mkdtemp(dir="/tmp"))   # pytest's own tmp is 0700: every path in it is blocked there
    try:
        os.chmod(base, 0o755)
        private = base / "private"
        private.mkdir(mode=0o700)
        (private / "mod.py").write_text("")
        uid = 123456
        assert blocked(str(private / "mod.py"), uid, {uid}) == f"{private} is drwx------ (owner {pwd.getpwuid(os.getuid()).pw_name})"
        os.chmod(private, 0o755)
        assert blocked(str(private / "mod.py"), uid, {uid}) is None
        os.chmod(private / "mod.py", 0o600)
        assert "mod.py is -rw-------" in blocked(str(private / "mod.py"), uid, {uid})
        assert blocked(str(private / "mod.py"), os.stat(private).st_uid, set()) is None   # its owner
    finally:
        shutil.rmtree(base)


def test_the_workers_user(tmp_path):
    with pytest.raises(WorkerUserError, match="no such user"):
        resolve_user("no-such-user-p2pfaas")
    settings = NodeSettings(data_dir=tmp_path)
    sandbox = decide(settings)
    if os.geteuid() != 0:   # an unprivileged node keeps its own user, and may not pick another
        assert sandbox.uid is None and not sandbox.drop_caps
        with pytest.raises(WorkerUserError, match="only a node run as root"):
            decide(settings.model_copy(update={"worker_user": "nobody"}))
    elif sandbox.uid is None:   # root, and nobody cannot run this interpreter: root without capabilities, said
        assert sandbox.drop_caps and "not as nobody" in sandbox.notes[0]
        with pytest.raises(WorkerUserError, match="nobody cannot"):
            decide(settings.model_copy(update={"worker_user": "nobody"}))
    else:
        assert sandbox.uid == resolve_user("nobody")[0] and sandbox.groups == []
    assert decide(settings.model_copy(update={"worker_user": str(os.geteuid())})).uid is None   # its own: no change
    assert (sandbox.landlock is not None) == bool(landlock_abi())
