"""Settings of one node (one pydantic object; defaults run the embedded stack)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from broker.messages import NodeConfiguration, SchedulerConfiguration

ONE_MIB = 1024 * 1024


class NodeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_id: str = Field(default="n1", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "faas"
    data_dir: Path = Path("data")
    address: str = ""                      # advertised (e.g. its HTTP bridge URL)
    max_payload_bytes: int = Field(default=ONE_MIB, ge=1)
    runtime: Literal["process", "inprocess"] = "process"
    ack_wait_s: float = Field(default=10.0, gt=0)   # a silent worker's task is redelivered after this
    max_deliver: int = Field(default=4, ge=2)       # last delivery is not run: it dead-letters
    functions: list[tuple[str, str]] = Field(default_factory=list)  # user (name, module:function)
    initial: NodeConfiguration = NodeConfiguration()
    initial_scheduler: SchedulerConfiguration = SchedulerConfiguration()
    telemetry_period_s: float = Field(default=1.0, gt=0)

    @property
    def node_dir(self) -> Path:
        return self.data_dir / "nodes" / self.node_id

    @classmethod
    def from_env(cls, **overrides: object) -> "NodeSettings":
        """Defaults < P2PFAAS_* environment < explicit overrides."""
        env = {
            "node_id": os.environ.get("P2PFAAS_NODE_ID"),
            "nats_url": os.environ.get("P2PFAAS_NATS_URL"),
            "prefix": os.environ.get("P2PFAAS_PREFIX"),
            "data_dir": os.environ.get("P2PFAAS_DATA_DIR"),
        }
        values = {k: v for k, v in env.items() if v}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
