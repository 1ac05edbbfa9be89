"""The function registry: what a node can run, bytes in, bytes out: the built-ins, ``module:function``
references (docs/functions.md) and container images, ``image:<ref>`` (docs/containers.md)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any, Mapping

from functions import builtins
from functions.image import ImageFunction, parse_image_reference
from functions.spec import CONCURRENT, FunctionBody, FunctionSpec

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
IMAGE_TIMEOUT_S = 60.0


class FunctionRegistry:
    def __init__(self) -> None:
        self._specs: dict[str, FunctionSpec] = {}

    def add(self, spec: FunctionSpec) -> None:
        if not NAME_RE.match(spec.name):
            raise ValueError(f"invalid function name {spec.name!r}: must match [A-Za-z0-9_-]{{1,64}}")
        self._specs[spec.name] = spec

    def add_reference(self, name: str, reference: str, *, timeout_s: float = 30.0, requires_input: bool = False,
                      env: dict[str, str] | None = None) -> FunctionSpec:
        """Register ``module:function`` (ValueError if it cannot be imported) or ``image:<ref>`` under
        ``name``. An ``async def`` or image function runs up to :data:`CONCURRENT` calls per worker, any
        other one call (CPU-bound) unless it sets ``p2pfaas_concurrency``; ``p2pfaas_retry_backoff_s``
        (seconds) sets the waits before the retries of a task whose worker died."""

        image = parse_image_reference(reference)
        if image is not None:  # the first call starts the container: allow for its cold start
            timeout_s = max(timeout_s, IMAGE_TIMEOUT_S)
            body: FunctionBody = ImageFunction(name, image, timeout_s=timeout_s, environment=env)
            concurrency = CONCURRENT
        else:
            body = load_reference(reference)
            concurrency = getattr(body, "p2pfaas_concurrency", CONCURRENT if inspect.iscoroutinefunction(body) else 1)
        backoff = getattr(body, "p2pfaas_retry_backoff_s", ())
        try:
            backoff = tuple(backoff)
        except TypeError:
            raise ValueError(f"{reference}: p2pfaas_retry_backoff_s must be a list of seconds") from None
        spec = FunctionSpec(name, body, timeout_s, requires_input, f"user function {reference}",
                            concurrency=int(concurrency), retry_backoff_s=backoff)
        self.add(spec)
        return spec

    def remove(self, name: str) -> None:
        self._specs.pop(name, None)

    def get(self, name: str) -> FunctionSpec | None:
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return sorted(self._specs)


def load_reference(reference: str) -> FunctionBody:
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"function reference {reference!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for {reference!r}: {exc}") from exc
    body = getattr(module, attr, None)
    if not callable(body):
        raise ValueError(f"{reference!r} is not a callable")
    return body


def parse_function_specs(text: str) -> list[tuple[str, str]]:
    """``"a=pkg.mod:f,b=pkg.mod:g"`` -> [("a", "pkg.mod:f"), ...]."""
    pairs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, ref = item.partition("=")
        if not sep:
            raise ValueError(f"function spec {item!r} must look like name=package.module:function")
        pairs.append((name.strip(), ref.strip()))
    return pairs


def default_registry(extra: str | list[tuple[str, str]] = "",
                     env: dict[str, dict[str, str]] | None = None,
                     options: Mapping[str, Any] | None = None) -> FunctionRegistry:
    """Built-ins plus user functions (``name=module:function`` pairs); ``env``: the variables of
    each (an image function's container gets its own); ``options``: by function, what a deployment
    sets instead of the code (``timeout_s``, ``concurrency`` attributes, None where not set)."""

    registry = FunctionRegistry()
    for spec in builtins.SPECS:
        registry.add(spec)
    pairs = parse_function_specs(extra) if isinstance(extra, str) else extra
    for name, ref in pairs:
        spec = registry.add_reference(name, ref, env=(env or {}).get(name))
        chosen = (options or {}).get(name)
        if chosen is not None:
            registry.add(with_options(spec, getattr(chosen, "timeout_s", None), getattr(chosen, "concurrency", None)))
            if hasattr(spec.body, "memory_bytes"):   # an image function: its container's limits
                spec.body.memory_bytes = getattr(chosen, "memory_bytes", None)
                spec.body.cpus = getattr(chosen, "cpus", None)
    return registry


def with_options(spec: FunctionSpec, timeout_s: float | None, concurrency: int | None) -> FunctionSpec:
    """``spec`` with a deployment's timeout and concurrency where it sets them."""
    changes: dict[str, Any] = {}
    if timeout_s is not None:
        changes["timeout_s"] = float(timeout_s)
    if concurrency is not None:
        changes["concurrency"] = int(concurrency)
    return dataclasses.replace(spec, **changes) if changes else spec


def function_environment(env: dict[str, dict[str, str]]) -> dict[str, str]:
    """What a worker process that loads every function sets: each one's variables (a name two
    functions set differently is refused when the second is deployed, see env_conflicts)."""
    return {k: v for variables in env.values() for k, v in variables.items()}


def env_conflicts(env: dict[str, dict[str, str]], name: str, variables: dict[str, str]) -> list[str]:
    """The variables of ``name`` that another function sets to another value: the functions of a
    pool share its worker processes, so their environment."""
    return [f"{k} (set by {other} to another value)" for other, theirs in sorted(env.items()) if other != name
            for k, v in variables.items() if k in theirs and theirs[k] != v]
