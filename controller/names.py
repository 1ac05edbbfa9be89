"""Scaling policy names, the same for every command, checked without importing numpy or torch so
that a wrong one is said at once, with the nearest valid names."""

from __future__ import annotations

import difflib
from pathlib import Path

BASELINE_NAMES = ("reactive-avg", "reactive-max", "keda", "kpa", "hpa")   # controller/baselines.py BASELINES
RL_NAMES = ("dqn", "pg", "sarsa")                                          # controller/training.py RL_KINDS
ALIASES = {"reactive": "reactive-avg",   # the paper's reactive controller (on average latency)
           "ppo": "pg"}                  # pg is PPO (docs/autoscaling.md)
AUTO = "auto"                            # the shipped model, learning online
OFF = "off"                              # up: no controller
MODEL_SUFFIX = ".npz"                     # our agents' portable weights (train scaling)
SB3_SUFFIX = ".zip"                       # a Stable-Baselines3 model (controller/sb3.py)
MODEL_SUFFIXES = (MODEL_SUFFIX, SB3_SUFFIX)


class PolicyNameError(ValueError):
    """A policy name no command knows; the message names the nearest valid ones."""


def known(*, auto: bool = True, off: bool = False) -> str:
    """The valid names, as one line for a help text or an error."""
    def with_alias(name: str) -> str:
        aliases = [alias for alias, target in ALIASES.items() if target == name]
        return f"{name} ({', '.join(aliases)})" if aliases else name

    return ", ".join([*([AUTO] if auto else []), *map(with_alias, RL_NAMES),
                      f"a model {MODEL_SUFFIX} (or a Stable-Baselines3 {SB3_SUFFIX})",
                      *map(with_alias, BASELINE_NAMES), "fixed-<n>", *([OFF] if off else [])])


def canonical(name: str, *, auto: bool = True, off: bool = False) -> str:
    """``name`` with its alias resolved, or PolicyNameError (a missing model file, ``fixed-0``...)."""
    name = name.strip()
    name = ALIASES.get(name, name)
    if name in RL_NAMES or name in BASELINE_NAMES or (auto and name == AUTO) or (off and name == OFF):
        return name
    if name.startswith("fixed-"):
        size = name.removeprefix("fixed-")
        if size.isdigit() and int(size) >= 1:
            return name
        raise PolicyNameError(f"{name!r}: fixed-<n> takes a worker count of 1 or more, e.g. fixed-8")
    if name.endswith(MODEL_SUFFIXES):
        if not Path(name).is_file():
            raise PolicyNameError(f"no model file {name}")
        return name
    candidates = [*RL_NAMES, *BASELINE_NAMES, *ALIASES, *([AUTO] if auto else []), *([OFF] if off else [])]
    raise PolicyNameError(f"unknown policy {name!r}: {_nearest(name, candidates)}known: {known(auto=auto, off=off)}")


def rl_agent(name: str) -> str:
    """An RL agent's name (``ppo`` -> ``pg``), or PolicyNameError naming the agents."""
    name = ALIASES.get(name.strip(), name.strip())
    if name in RL_NAMES:
        return name
    agents = [*RL_NAMES, *(alias for alias, target in ALIASES.items() if target in RL_NAMES)]
    raise PolicyNameError(f"unknown agent {name!r}: {_nearest(name, agents)}available: "
                          f"{', '.join(RL_NAMES)} (ppo: pg)")


def _nearest(name: str, candidates: list[str]) -> str:
    near = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    return f"did you mean {' or '.join(filter(None, [', '.join(near[:-1]), near[-1]]))}? " if near else ""
