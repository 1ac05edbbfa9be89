"""The learner API (docs/learner.md): act, train, weights, parameters, stats."""

from __future__ import annotations

import time
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, RootModel

from broker.messages.base import Contract, FiniteFloat


def _state_from_text(value: Any) -> Any:
    """P2PFaaS sends states as ``"f1,f2,..."``; lists pass through."""
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",")]
        if not value.strip() or any(not item for item in items):
            raise ValueError(f"state {value!r} is not a comma-separated list of numbers")
        return items
    return value


StateVector = Annotated[list[FiniteFloat], Field(min_length=1, max_length=4096), BeforeValidator(_state_from_text)]


class LearnerActRequest(Contract):
    """Request on ``faas.<node>.learner.<model>.act``. ``explore`` is P2PFaaS's /act:
    epsilon-greedy, and epsilon decays; ``explore=False`` is greedy and changes nothing."""

    state: StateVector
    explore: bool = True


class LearnerAction(Contract):
    """Answer of ``act``: the action and the epsilon the decision used (``X-P2pfaas-Eps``)."""

    action: int
    eps: float
    model: str
    algorithm: str


class LearnerTrainSample(Contract):
    """One scheduling sample as P2PFaaS's learner API takes it (``/learner/train``,
    ``/learner/train_batch``): the state may be ``"a,b"`` text or a list of numbers."""

    eid: int = Field(ge=0)
    state: StateVector
    action: int = Field(ge=0)
    reward: FiniteFloat


class LearnerTrainBatch(RootModel[list[LearnerTrainSample]]):
    """Body of ``POST /learner/train_batch``: a JSON array of samples."""

    model_config = ConfigDict(frozen=True)


class LearnerParameters(RootModel[dict[str, Any]]):
    """Hyper-parameters of a model by name (``parameters.get`` / ``parameters.set``); values
    may be strings as P2PFaaS sends them. ``"reset": true`` in a set rebuilds the model."""

    model_config = ConfigDict(frozen=True)


class LearnerWeights(Contract):
    """What acting needs, published on ``faas.<node>.learner.<model>.weights`` (and the
    answer of ``weights.get``): enough to rebuild the agent and ``set_weights`` it."""

    node: str
    model: str
    algorithm: str
    obs_dim: int
    n_actions: int
    config: dict[str, Any]
    version: int                  # experiences applied to the model so far
    weights_b64: str              # Agent.get_weights(), base64
    at: float = Field(default_factory=time.time)


class LearnerStats(Contract):
    """Answer of ``faas.<node>.learner.<model>.stats``."""

    node: str
    model: str
    algorithm: str
    obs_dim: int
    n_actions: int
    exists: bool                  # False until the first act/experience creates the model
    experiences: int              # applied to this model
    pending: int                  # scheduling samples waiting for their successor EID
    malformed: int                # experiences of the node refused (logged, acknowledged)
    stream_seq: int               # last experience-stream sequence applied (all models of the node)
    checkpoint_seq: int           # stream sequence of the newest checkpoint on disk
    weights_published: int
    agent: dict[str, Any] = Field(default_factory=dict)
    unknown_models: int = 0       # requests to the node's learner naming a model it does not keep (404)
