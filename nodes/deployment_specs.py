"""A deployment read as this node's settings: the function's options, the pool of its own it
asks for, and the deployments a node saved (``functions.json``)."""

from __future__ import annotations

import orjson
from pydantic import ValidationError

from broker.messages import FunctionDeployment, FunctionScaling
from functions.image import parse_image_reference
from nodes.settings import FunctionOptions, PoolSpec


def options_of(deployment: FunctionDeployment) -> FunctionOptions:
    """What the deployment sets instead of the code: timeout, concurrency, an image's limits."""
    image = parse_image_reference(deployment.reference) is not None
    limits = deployment.limits
    return FunctionOptions(timeout_s=deployment.timeout_s, concurrency=deployment.concurrency,
                           memory_bytes=limits.memory_bytes if limits and image else None,
                           cpus=limits.cpus if limits and image else None)


def function_pool(deployment: FunctionDeployment) -> PoolSpec:
    """The pool of its own a deployment asks for: scaling bounds (FunctionScaling's defaults when it
    asks only for secrets or limits), idle time, secrets and a worker process's memory."""
    scaling = deployment.scaling or FunctionScaling()
    image = parse_image_reference(deployment.reference) is not None
    limits = deployment.limits
    return PoolSpec(functions=[deployment.service], min=scaling.min, max=scaling.max, initial=scaling.min,
                    zero_after_s=scaling.idle_s, function_pool=True, secrets=list(deployment.secrets),
                    memory_bytes=limits.memory_bytes if limits and not image else None,
                    cpus=limits.cpus if limits and not image else None)


def memory_text(value: int | None) -> str | None:
    """Bytes as OpenFaaS writes a memory limit (``256Mi``)."""
    if not value:
        return None
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def deployed_functions(data: bytes) -> list[FunctionDeployment]:
    """``functions.json``: a JSON list of deployments or of ``[name, reference]`` pairs; else ValueError."""
    saved = orjson.loads(data)
    wrong = 'it must be a JSON list of ["name", "reference"] pairs or of deployments'
    if not isinstance(saved, list):
        raise ValueError(wrong)
    out = []
    for item in saved:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            item = {"service": item[0], "reference": item[1]}
        if not isinstance(item, dict):
            raise ValueError(wrong)
        try:
            out.append(FunctionDeployment.model_validate(item))
        except ValidationError as exc:
            raise ValueError(f"{wrong} ({exc.errors()[0]['msg']})") from None
    return out
