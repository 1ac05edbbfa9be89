"""Settings of the learner service (one pydantic object; defaults run the embedded stack)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.subjects import SCHEDULING_MODEL, check_node, check_token, scaling_model

SchedulingAgent = Literal["dsarsa", "dqn"]
SHIPPED_SCHEDULING_MODEL = Path(__file__).with_name("shipped") / "scheduling-dsarsa.npz"
ScalingAgent = Literal["dqn", "pg", "sarsa", "dsarsa"]


class LearnerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_ids: list[str] = Field(default_factory=lambda: ["n1"], min_length=1)
    """Nodes this learner serves (one per node by default; a shared learner lists several)."""
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "faas"
    data_dir: Path = Path("data")
    """Checkpoints go to ``<data_dir>/nodes/<node>/learner/``."""

    scheduling_agent: SchedulingAgent = "dsarsa"
    """The scheduling model: P2PFaaS's differential SARSA, or a DQN for continuous states."""
    scheduling_actions: int = Field(default=2, ge=1)
    """P2PFaaS's ``actions_n`` default; the LearningScheduler sets its own through parameters."""
    scheduling_obs_dim: int | None = Field(default=None, ge=1)
    """DQN only: the state size; None creates the model from the first state seen."""
    scheduling_parameters: dict[str, Any] = Field(default_factory=dict)
    """Initial hyper-parameters of the scheduling model (the agent's config fields)."""
    scheduling_model: Path | None = SHIPPED_SCHEDULING_MODEL
    """The differential-SARSA table (.npz) an empty scheduling model starts from once sized to its
    actions (default: the shipped one); None always starts empty."""

    scaling_agent: ScalingAgent = "dqn"
    """Kind of each pool's scaling model, created on the pool's first act or experience."""
    scaling_actions: int = Field(default=7, ge=1)
    """The target action space of controller/features.py: keep, or one of six sizes."""
    scaling_parameters: dict[str, Any] = Field(default_factory=dict)
    pools: list[str] = Field(default_factory=lambda: ["default"])
    """The pools that have a scaling model (``scaling-<pool>``); any other model name and its
    experiences are refused, else any client could fill memory and disk with them."""

    seed: int = 0
    checkpoint_period_s: float = Field(default=5.0, gt=0)
    """A node's models are checkpointed this often when they changed (and on stop)."""
    weights_period_s: float = Field(default=1.0, gt=0)
    """At most one weights publication per model per period, after training."""
    fetch_batch: int = Field(default=256, ge=1)
    ack_wait_s: float = Field(default=30.0, gt=0)
    max_pending_samples: int = Field(default=1000, ge=2)
    """Scheduling samples kept waiting for their successor EID; the oldest are dropped beyond."""

    @field_validator("node_ids")
    @classmethod
    def _valid_nodes(cls, value: list[str]) -> list[str]:
        for node in value:
            check_node(node)
        if len(set(value)) != len(value):
            raise ValueError(f"node ids repeat: {value}")
        return value

    @field_validator("pools")
    @classmethod
    def _valid_pools(cls, value: list[str]) -> list[str]:
        for pool in value:
            scaling_model(check_token(pool, "pool"))   # the model token must be valid too
        return list(dict.fromkeys(value))

    @property
    def models(self) -> list[str]:
        """Every model a node's learner keeps: the scheduling model and one per pool."""
        return [SCHEDULING_MODEL, *(scaling_model(pool) for pool in self.pools)]

    def learner_dir(self, node: str) -> Path:
        return self.data_dir / "nodes" / node / "learner"

    @classmethod
    def for_node(cls, node_settings: Any, **overrides: Any) -> "LearnerSettings":
        """The learner of one node, sharing its NATS, prefix, data directory and pools."""
        values = dict(node_ids=[node_settings.node_id], nats_url=node_settings.nats_url, prefix=node_settings.prefix,
                      data_dir=node_settings.data_dir, pools=["default", *node_settings.pools])
        return cls(**{**values, **overrides})
