"""The files a node keeps under ``<data-dir>/nodes/<node>/``: a broken one is refused by name,
never read as absent; a write is whole (temporary file, fsync, rename) or leaves the old one."""

from __future__ import annotations

import errno
import os

import pytest

from broker.errors import NodeFileError
from broker.messages import NodeConfiguration, SchedulerConfiguration
from nodes.config_store import ConfigStore, write_node_file
from nodes.node import Node
from nodes.settings import NodeSettings


def settings_in(tmp_path) -> NodeSettings:
    settings = NodeSettings(node_id="n1", data_dir=tmp_path, learner=False)
    settings.node_dir.mkdir(parents=True)
    return settings


@pytest.mark.parametrize("name, content", [
    ("configuration.json", b""),                                   # emptied by a crash mid-write
    ("configuration.json", b'{"parallel_running_functions_max": 4, "queue'),
    ("configuration.json", b'{"parallel_running_functions_max": 0}'),
    ("scheduler.json", b'{"name": "PowerOfNSched'),
    # an algorithm this version refuses (a tau above 10 s was accepted before): said, not a traceback
    ("scheduler.json", b'{"name": "PowerOfNSchedulerTau", "parameters": ["1", "2", "true", "1", "1h"]}'),
    ("scheduler.json", b'{"name": "NoSuchScheduler", "parameters": []}'),
])
def test_a_broken_configuration_file_is_refused_by_name(tmp_path, name, content):
    settings = settings_in(tmp_path)
    path = settings.node_dir / name
    path.write_bytes(content)
    with pytest.raises(NodeFileError) as refused:
        Node(settings)
    message = str(refused.value)
    assert message.startswith(f"{path} is not valid (") and "\n" not in message
    assert message.endswith("fix it, or delete it to start from the defaults")
    assert path.read_bytes() == content   # left as it was, for the user to look at


def test_an_unreadable_configuration_file_is_refused_by_name(tmp_path):
    settings = settings_in(tmp_path)
    (settings.node_dir / "scheduler.json").mkdir()   # not a file: reading it fails
    with pytest.raises(NodeFileError, match=r"scheduler\.json cannot be read \(Is a directory\): fix it"):
        Node(settings)


def test_without_files_the_defaults_are_used_and_a_change_is_kept(tmp_path):
    store = ConfigStore(tmp_path, NodeConfiguration(), SchedulerConfiguration())
    assert store.node == NodeConfiguration() and list(tmp_path.iterdir()) == []
    store.set_node(NodeConfiguration(parallel_running_functions_max=7))
    again = ConfigStore(tmp_path, NodeConfiguration(), SchedulerConfiguration())
    assert again.node.parallel_running_functions_max == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configuration.json"]   # no temporary file left


def test_a_write_that_fails_on_a_full_disk_leaves_the_old_file_and_configuration(tmp_path, monkeypatch):
    """The data reaches the disk (fsync) before the rename: a full disk shows there, and the file
    and the configuration in force stay the old ones."""
    store = ConfigStore(tmp_path, NodeConfiguration(), SchedulerConfiguration())
    store.set_node(NodeConfiguration(parallel_running_functions_max=3))
    before = (tmp_path / "configuration.json").read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        store.set_node(NodeConfiguration(parallel_running_functions_max=9))
    monkeypatch.undo()
    assert (tmp_path / "configuration.json").read_bytes() == before
    assert store.node.parallel_running_functions_max == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configuration.json"]


def test_write_node_file_syncs_the_file_and_its_directory(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    write_node_file(tmp_path / "sub" / "x.json", b"[1]")
    assert (tmp_path / "sub" / "x.json").read_bytes() == b"[1]"
    assert len(synced) == 2 and synced[0].startswith(str(tmp_path / "sub" / ".x.json."))
    assert synced[1] == str(tmp_path / "sub")
