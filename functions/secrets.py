"""The deployment's secrets a function was given, ``functions.secret(name)``: its pool's workers are
handed them at their start, never through the environment or on disk (docs/functions.md, "Secrets");
an image function's container finds them as files under ``/var/openfaas/secrets/``."""

from __future__ import annotations

from typing import Mapping

_given: dict[str, str] = {}


class SecretNotGiven(KeyError):
    """The function asked for a secret its deployment does not list."""

    def __str__(self) -> str:
        return str(self.args[0])


def secret(name: str) -> str:
    """The value of the deployment's secret ``name``, or SecretNotGiven."""
    try:
        return _given[name]
    except KeyError:
        raise SecretNotGiven(f"secret {name!r} was not given to this function: list it in its deployment's "
                             "secrets (p2pfaas deploy --secret NAME)") from None


def given() -> dict[str, str]:
    """Every secret this process was given (an image function hands them to its container)."""
    return dict(_given)


def give(values: Mapping[str, str], *, replace: bool = True) -> None:
    """At a worker's start, before any function is imported (a node's in-process workers share
    one process: ``replace`` False adds a pool's to the others')."""
    if replace:
        _given.clear()
    _given.update(values)
