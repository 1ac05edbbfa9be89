"""Using a learner's model from a scheduler or a controller: `RemotePolicy` asks the learner
(one request/reply per decision), `LocalPolicy` keeps a copy fresh from the published weights
and acts in-process. docs/learner.md says when to use which."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any, Callable

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from broker.codec import decode, encode
from broker.messages import LearnerAction, LearnerActRequest, LearnerParameters, LearnerStats, LearnerWeights
from broker.subjects import SCHEDULING_MODEL, LearnerVerb, Subjects
from nodes.learner.models import agent_from_weights
from nodes.learner.service import STATUS_HEADER

log = logging.getLogger(__name__)


class LearnerError(RuntimeError):
    """The learner refused a request (``status`` 400/404/500) or did not answer (503)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class RemotePolicy:
    """A learner model over request/reply: the newest model and the learner's exploration, one round trip."""

    def __init__(self, nc: Client, node: str, model: str = SCHEDULING_MODEL, *, prefix: str = "faas",
                 timeout_s: float = 2.0) -> None:
        self.nc, self.node, self.model, self.timeout_s = nc, node, model, timeout_s
        self.subjects = Subjects(prefix)
        self.subjects.learner(node, model, "act")  # validates node and model now

    async def _request(self, verb: LearnerVerb, body: bytes = b"") -> bytes:
        subject = self.subjects.learner(self.node, self.model, verb)
        try:
            msg = await self.nc.request(subject, body, timeout=self.timeout_s)
        except (NatsTimeout, NoRespondersError, asyncio.TimeoutError):
            raise LearnerError(503, f"no learner answered on {subject}") from None
        status = int((msg.headers or {}).get(STATUS_HEADER, 200))
        if status != 200:
            try:
                message = orjson.loads(msg.data)["message"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                message = msg.data.decode(errors="replace")
            raise LearnerError(status, message)
        return msg.data

    async def act(self, state: list[float], explore: bool = True) -> LearnerAction:
        return decode(LearnerAction, await self._request("act", encode(LearnerActRequest(state=state, explore=explore))))

    async def parameters(self) -> dict[str, Any]:
        return decode(LearnerParameters, await self._request("parameters.get")).root

    async def set_parameters(self, values: dict[str, Any]) -> dict[str, Any]:
        return decode(LearnerParameters, await self._request("parameters.set", orjson.dumps(values))).root

    async def stats(self) -> LearnerStats:
        return decode(LearnerStats, await self._request("stats"))

    async def reset(self) -> LearnerStats:
        return decode(LearnerStats, await self._request("reset"))

    async def weights(self) -> LearnerWeights:
        return decode(LearnerWeights, await self._request("weights.get"))

    async def set_weights(self, weights: LearnerWeights) -> LearnerStats:
        """Make the learner's model continue from ``weights``; its stats (``experiences`` = version)."""
        return decode(LearnerStats, await self._request("weights.set", encode(weights)))


class LocalPolicy:
    """A local copy of a learner model, replaced whenever the learner publishes weights: ``act()``
    is a plain function call, with the copy's own exploration."""

    def __init__(self, nc: Client, node: str, model: str = SCHEDULING_MODEL, *, prefix: str = "faas",
                 timeout_s: float = 2.0, on_update: Callable[[LearnerWeights, Any], None] | None = None) -> None:
        """``on_update(weights, agent)`` is called after every new copy (e.g. to swap a controller's policy)."""
        self.nc, self.node, self.model, self.on_update = nc, node, model, on_update
        self.subjects = Subjects(prefix)
        self.remote = RemotePolicy(nc, node, model, prefix=prefix, timeout_s=timeout_s)
        self.agent: Any = None
        self.weights: LearnerWeights | None = None
        self.updates = 0
        self._shape: tuple | None = None
        self._changed = asyncio.Condition()
        self._sub = None

    @property
    def ready(self) -> bool:
        return self.agent is not None

    @property
    def version(self) -> int:
        """Experiences the copied model had seen (-1: no weights yet)."""
        return self.weights.version if self.weights else -1

    async def start(self) -> "LocalPolicy":
        """Subscribe, then fetch the current weights (none yet is fine: they come when trained)."""
        self._sub = await self.nc.subscribe(self.subjects.learner(self.node, self.model, "weights"), cb=self._on_weights)
        await self.nc.flush()  # subscribed at the server before asking: no publication falls in between
        try:
            current = await self.remote.weights()
        except LearnerError as exc:
            log.info("local policy %s/%s: no weights yet (%s)", self.node, self.model, exc)
        else:
            if self.weights is None or self.weights.at < current.at:  # a publication may have come first
                await self._apply(current)
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def __aenter__(self) -> "LocalPolicy":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def act(self, state: list[float], explore: bool = False) -> LearnerAction:
        """Act with the local copy; LookupError while no weights have arrived (use RemotePolicy then)."""
        if self.agent is None:
            raise LookupError(f"no weights of {self.node}/{self.model} yet")
        eps = float(getattr(self.agent, "epsilon", 0.0)) if explore else 0.0
        action = int(self.agent.act(state, explore=explore))
        return LearnerAction(action=action, eps=eps, model=self.model, algorithm=self.weights.algorithm)  # type: ignore[union-attr]

    async def wait_version(self, version: int, timeout_s: float = 10.0) -> None:
        """Wait until weights of at least ``version`` experiences arrived (TimeoutError otherwise)."""
        async with self._changed:
            async with asyncio.timeout(timeout_s):
                await self._changed.wait_for(lambda: self.version >= version)

    async def _on_weights(self, msg: Msg) -> None:
        try:
            await self._apply(decode(LearnerWeights, msg.data))
        except Exception as exc:  # malformed, incompatible, corrupt: whatever it is, the previous weights act
            log.warning("local policy %s/%s: weights refused, keeping the previous ones: %s: %s", self.node, self.model,
                        type(exc).__name__, exc)

    async def _apply(self, weights: LearnerWeights) -> None:
        shape = (weights.algorithm, weights.obs_dim, weights.n_actions, orjson.dumps(weights.config))
        if self.agent is not None and shape == self._shape:
            epsilon = getattr(self.agent, "epsilon", None)
            try:
                self.agent.set_weights(base64.b64decode(weights.weights_b64))
            except Exception:
                # a load failed half-way has overwritten tensors of the acting agent: restore the last good
                if self.weights is not None:
                    self.agent.set_weights(base64.b64decode(self.weights.weights_b64))
                raise
            if weights.algorithm == "dsarsa" and epsilon is not None:
                self.agent.epsilon = epsilon  # exploration stays the copy's own
        else:
            self.agent, self._shape = agent_from_weights(weights), shape
        self.weights = weights
        self.updates += 1
        if self.on_update is not None:
            self.on_update(weights, self.agent)
        async with self._changed:
            self._changed.notify_all()
