"""Deployed functions (OpenFaaS's deploy body as p2pfaas reads it), their pools and secrets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, RootModel, model_validator

from broker.messages.base import Contract


def _not_ours(name: str) -> str:
    if name.upper().startswith("P2PFAAS_"):
        raise ValueError(f"{name}: P2PFAAS_ variables are the platform's")
    return name


EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"), AfterValidator(_not_ours)]
LabelName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,252}$")]


SecretName = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")]   # OpenFaaS's (DNS labels)
DEFAULT_ZERO_AFTER_S = 60.0   # a pool that may scale to zero does after this long without a call


class FunctionScaling(Contract):
    """A function's own pool of workers: ``min``..``max`` of them. With ``min`` 0 the pool scales to
    zero after ``zero_after_s`` without a call (default DEFAULT_ZERO_AFTER_S); its next call waits for
    the cold start. ``policy``: the controller's scaling policy for it (``off``: the size it is given)."""

    min: int = Field(default=1, ge=0, le=256)
    max: int = Field(default=16, ge=1, le=256)
    zero_after_s: float | None = Field(default=None, gt=0, le=86400)
    policy: str = Field(default="kpa", pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")

    @model_validator(mode="after")
    def _bounds(self) -> "FunctionScaling":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if self.zero_after_s is not None and self.min > 0:
            raise ValueError("zero_after_s needs min 0: a pool scales to zero only if it may have no worker")
        return self

    @property
    def idle_s(self) -> float | None:
        """Seconds without a call before the pool scales to zero (None: it never does)."""
        return (self.zero_after_s or DEFAULT_ZERO_AFTER_S) if self.min == 0 else None


class FunctionLimits(Contract):
    """What one worker of a function's own pool may use: memory in bytes (a process's address
    space, a container's memory) and CPUs (a container's share; a process's CPU time per second)."""

    memory_bytes: int | None = Field(default=None, ge=16 * 1024 * 1024, le=1 << 40)
    cpus: float | None = Field(default=None, gt=0, le=256)


class FunctionDeployment(Contract):
    """Deploy on ``faas.<node>.functions.deploy``, and a function of the catalogue
    (nodes/catalogue.py): ``reference`` is ``package.module:callable`` or ``image:<ref>`` (an
    OpenFaaS-style image), as ``p2pfaas up --function name=reference``; ``env_vars`` reach the
    function's environment (its workers', or its container's), OpenFaaS's ``envVars``.

    ``timeout_s`` and ``concurrency`` (calls one worker runs at once) replace the function's own.
    ``scaling``, ``secrets`` (read with ``functions.secret(name)``) and ``limits`` give it a pool of its
    own (shared workers could neither be scaled for it nor keep its secrets from others' code)."""

    service: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    reference: str = Field(min_length=1, max_length=512)
    env_vars: dict[EnvName, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict, max_length=64)
    labels: dict[LabelName, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict, max_length=64)
    annotations: dict[LabelName, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict,
                                                                                 max_length=64)
    timeout_s: float | None = Field(default=None, gt=0, le=86400)
    concurrency: int | None = Field(default=None, ge=1, le=1024)
    scaling: FunctionScaling | None = None
    secrets: list[SecretName] = Field(default_factory=list, max_length=32)
    limits: FunctionLimits | None = None

    @property
    def own_pool(self) -> bool:
        return self.scaling is not None or bool(self.secrets) or self.limits is not None


class FunctionScale(Contract):
    """On ``faas.<node>.functions.scale`` (``replicas``) and ``.delete`` / ``.scale_delay`` (``service`` only)."""

    service: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    replicas: int | None = Field(default=None, ge=0, le=1024)


class FunctionInfo(Contract):
    """One function as OpenFaaS's ``GET /system/functions`` lists it. ``replicas`` are the workers
    that may run it (its pool's size), ``availableReplicas`` those ready; ``image`` is the image of
    an image function, else ``p2pfaas``; ``envProcess`` its ``module:callable``."""

    name: str
    image: str
    envProcess: str = ""
    envVars: dict[str, str] = Field(default_factory=dict)
    invocationCount: int = 0
    replicas: int
    availableReplicas: int
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    limits: dict[str, str] | None = None   # OpenFaaS's {memory: "256Mi", cpu: "0.5"}


class SecretChange(Contract):
    """On ``faas.<node>.functions.secrets_set`` and ``.secrets_delete`` (OpenFaaS's ``/system/secrets``
    body: ``name`` and, but for a delete, ``value``; a delete's ``mode`` is not read)."""

    name: str = Field(min_length=1, max_length=63)
    value: str | None = Field(default=None, max_length=65536)
    mode: Literal["create", "update", "set"] = "set"   # create: not if it exists; update: only if it does


class FunctionList(RootModel[list[FunctionInfo]]):
    model_config = ConfigDict(frozen=True)


class ScaleDelay(Contract):
    """P2PFaaS's ``/monitoring/scale-delay/{fn}``: seconds to add one worker to the function's pool."""

    approximate_delay: float
    error_margin: float
    attempts: int
