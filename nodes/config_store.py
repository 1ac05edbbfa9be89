"""Persistent node configuration (P2PFaaS /configuration and /configuration/scheduler)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from broker.codec import decode, encode
from broker.messages import NodeConfiguration, SchedulerConfiguration


class ConfigStore:
    """Keeps the two configuration documents in ``<node_dir>/*.json``, written atomically."""

    def __init__(self, directory: Path, node: NodeConfiguration, scheduler: SchedulerConfiguration) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.node: NodeConfiguration = self._load("configuration.json", NodeConfiguration, node)
        self.scheduler: SchedulerConfiguration = self._load("scheduler.json", SchedulerConfiguration, scheduler)

    def set_node(self, config: NodeConfiguration) -> None:
        self._write("configuration.json", config)
        self.node = config

    def set_scheduler(self, config: SchedulerConfiguration) -> None:
        self._write("scheduler.json", config)
        self.scheduler = config

    def _load(self, name: str, contract, default):
        path = self.directory / name
        if path.exists():
            return decode(contract, path.read_bytes())
        return default

    def _write(self, name: str, config) -> None:
        path = self.directory / name
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(orjson.loads(encode(config)), option=orjson.OPT_INDENT_2))
        os.replace(tmp, path)
