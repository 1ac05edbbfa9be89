"""Persistent node configuration (P2PFaaS /configuration and /configuration/scheduler), and how
every file a node keeps under ``<data-dir>/nodes/<node>/`` is read and written."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import orjson

from broker.codec import decode, encode
from broker.errors import NodeFileError
from broker.lifecycle import write_whole as write_node_file   # whole or not at all, fsynced
from broker.messages import NodeConfiguration, SchedulerConfiguration

T = TypeVar("T")
TO_DEFAULTS = "fix it, or delete it to start from the defaults"


def read_node_file(path: Path, parse: Callable[[bytes], T], todo: str) -> T | None:
    """``parse`` of the file at ``path``, None when there is none. An unreadable one is NodeFileError
    naming it and ``todo``: read as absent, the node would overwrite it with its next save."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NodeFileError(f"{path} cannot be read ({exc.strerror or exc}): {todo}") from None
    try:
        return parse(data)
    except ValueError as exc:   # ContractError and orjson's JSONDecodeError are ValueErrors
        raise NodeFileError(f"{path} is not valid ({exc}): {todo}") from None


class ConfigStore:
    """Keeps the two configuration documents in ``<node_dir>/*.json``, written atomically."""

    def __init__(self, directory: Path, node: NodeConfiguration, scheduler: SchedulerConfiguration) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.node: NodeConfiguration = self._load("configuration.json", NodeConfiguration, node)
        self.scheduler: SchedulerConfiguration = self._load("scheduler.json", SchedulerConfiguration, scheduler,
                                                            check=_buildable)

    def set_node(self, config: NodeConfiguration) -> None:
        self._write("configuration.json", config)
        self.node = config

    def set_scheduler(self, config: SchedulerConfiguration) -> None:
        self._write("scheduler.json", config)
        self.scheduler = config

    def _load(self, name: str, contract, default, check: Callable = lambda config: config):
        saved = read_node_file(self.directory / name, lambda data: check(decode(contract, data)), TO_DEFAULTS)
        return default if saved is None else saved

    def _write(self, name: str, config) -> None:
        write_node_file(self.directory / name, orjson.dumps(orjson.loads(encode(config)), option=orjson.OPT_INDENT_2))


def _buildable(config: SchedulerConfiguration) -> SchedulerConfiguration:
    """A saved algorithm this version refuses (ValueError) is a file to fix, said as such."""
    from nodes.scheduler.algorithms import build_algorithm   # the algorithms import the node's parts
    build_algorithm(config.name, config.parameters)
    return config
