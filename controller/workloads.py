"""Generated workloads: seeded families of farm scenarios (random phases, load levels, patterns and
cold starts), each a pure function of its seed; training seeds are >= 2**32, evaluation's below."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from controller.scenario import Scenario

GENERATED_PREFIX = "generated"
PAPER = "paper"        # the farm-skeleton paper's setting, its details drawn from the seed
MIXED = "mixed"        # training: generated workloads, and the shipped scenarios (other seeds), half each
MIXED_PAPER = "mixed-paper"   # training: the paper's setting for a quarter of the seeds, mixed for the rest
TRAINING_MIXES = (MIXED, MIXED_PAPER)


def _service(rng: np.random.Generator) -> dict[str, Any]:
    mean = float(rng.uniform(0.6, 2.0))
    kind = rng.choice(["gamma", "lognormal", "exponential"], p=[0.5, 0.3, 0.2])
    clamp = {"min": round(0.1 * mean, 3), "max": round(5 * mean, 3)}
    if kind == "gamma":
        shape = float(rng.uniform(2.0, 6.0))
        return {"dist": "gamma", "shape": round(shape, 3), "scale": round(mean / shape, 4), **clamp}
    if kind == "lognormal":
        sigma = float(rng.uniform(0.3, 0.6))
        return {"dist": "lognormal", "mu": round(math.log(mean) - sigma**2 / 2, 4), "sigma": round(sigma, 3), **clamp}
    return {"dist": "exponential", "mean": round(mean, 3), **clamp}


def _phases(rng: np.random.Generator, steps: int, step_s: float, max_load: float, mean_s: float) -> list[dict]:
    """Phases covering ``steps + 1`` periods: the load walks in log space, with surges and drops."""
    phases: list[dict] = []
    periods_left = steps + 1
    load = float(rng.uniform(0.1, 0.45)) * max_load
    while periods_left > 0:
        length = min(periods_left, int(rng.integers(4, 15)))
        if periods_left - length < 3:  # no stub of a phase at the end
            length = periods_left
        periods_left -= length
        duration = length * step_s
        rate = load / mean_s
        pattern = rng.choice(["constant", "sine", "spike"], p=[0.55, 0.3, 0.15])
        phase: dict[str, Any] = {"duration_s": duration, "rate_per_s": round(rate, 4)}
        if pattern == "sine":
            period = float(rng.integers(3, 13)) * step_s
            amplitude = rate * float(rng.uniform(0.1, 0.45))
            phase.update(pattern="sine", amplitude_per_s=round(amplitude, 4), period_s=period)
        elif pattern == "spike" and length >= 4:
            spike_len = int(rng.integers(1, min(4, length - 2) + 1))
            start = int(rng.integers(1, length - spike_len))
            spike_load = min(max_load, load * float(rng.uniform(1.5, 3.0)))
            phase.update(pattern="spike", spike_rate_per_s=round(spike_load / mean_s, 4),
                         spike_start_s=start * step_s, spike_duration_s=spike_len * step_s)
        phases.append(phase)
        jump = float(rng.uniform(1.8, 3.0)) if rng.random() < 0.2 else math.exp(float(rng.normal(0.0, 0.35)))
        if rng.random() < 0.5 and jump > 1.5:
            jump = 1 / jump  # surges and drops alike
        load = float(np.clip(load * jump, 0.05 * max_load, max_load))
    return phases


def generated_scenario(seed: int) -> Scenario:
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    step = float(rng.choice([5.0, 8.0, 10.0]))
    steps = int(rng.integers(30, 61))
    max_workers = int(rng.choice([16, 32]))
    service = _service(rng)
    probe = Scenario.model_validate({  # the mean of the clamped service distribution
        "name": "probe", "step_seconds": step, "workers": {"min": 1, "max": max_workers, "initial": 1},
        "service_time": service, "deadline": {"factor": 2}, "phases": [{"duration_s": 3 * step, "rate_per_s": 1}],
    })
    mean_s = probe.mean_service_s
    cold_low = float(rng.uniform(2.0, 7.0))
    down_low = float(rng.uniform(1.0, 3.0))
    # the busiest phase stays within ~70 % of the pool, so 99 % is reachable with workers.max
    max_load = 0.7 * max_workers
    data = {
        "name": f"{GENERATED_PREFIX}-{seed}",
        "description": "generated workload (controller/workloads.py)",
        "step_seconds": step,
        "max_steps": steps,
        "workers": {"min": 1, "max": max_workers, "initial": int(rng.integers(2, max_workers // 2 + 1))},
        "cold_start_seconds": {"dist": "uniform", "low": round(cold_low, 2), "high": round(cold_low + rng.uniform(1, 4), 2)},
        "scale_down_seconds": {"dist": "uniform", "low": round(down_low, 2), "high": round(down_low + rng.uniform(0.5, 2), 2)},
        "service_time": service,
        "deadline": {"factor": float(rng.choice([2.0, 3.0])), "min": round(float(rng.uniform(0.5, 1.0)), 2),
                     "max": round(10 * mean_s, 2)},
        "phases": _phases(rng, steps, step, max_load, mean_s),
    }
    return Scenario.model_validate(data)


def paper_scenario(seed: int) -> Scenario:
    """The farm-skeleton paper's setting, the details it does not give drawn from ``seed``: a quiet
    phase, a step to about 5x its load, then a lower plateau."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 27]))
    step, steps = 8.0, 30
    mean = float(rng.uniform(1.3, 1.7))
    shape = float(rng.uniform(3.0, 5.0))
    quiet = float(rng.uniform(1.0, 1.5))                  # arrivals per second
    peak = quiet * float(rng.uniform(4.5, 5.5))
    plateau = peak * float(rng.uniform(0.55, 0.8))
    quiet_periods = int(rng.integers(4, 9))               # the warm-up period included
    surge_periods = int(rng.integers(8, 13))
    rest = steps + 1 - quiet_periods - surge_periods
    data = {
        "name": f"{PAPER}-{seed}",
        "description": "the farm-skeleton paper's setting (controller/workloads.py)",
        "step_seconds": step,
        "max_steps": steps,
        "workers": {"min": 1, "max": 32, "initial": 12},
        "cold_start_seconds": {"dist": "uniform", "low": 5.2, "high": 9.0},
        "scale_down_seconds": {"dist": "uniform", "low": 2.0, "high": 4.0},
        "service_time": {"dist": "gamma", "shape": round(shape, 3), "scale": round(mean / shape, 4), "min": 0.2,
                         "max": 6.0},
        "deadline": {"factor": 2.0, "min": 1.0, "max": 12.0},
        "phases": [{"duration_s": n * step, "rate_per_s": round(rate, 4), "pattern": "constant"}
                   for n, rate in ((quiet_periods, quiet), (surge_periods, peak), (rest, plateau))],
    }
    return Scenario.model_validate(data)


FAMILIES = {GENERATED_PREFIX: generated_scenario, PAPER: paper_scenario}


def family_scenario(family: str, seed: int) -> Scenario:
    return FAMILIES[family](seed)


class MixError(ValueError):
    """A training mix that cannot be drawn from (a bad weight, an unknown or nested part)."""


def is_mix(workloads: str) -> bool:
    """``NAME:WEIGHT,...`` (``paper:40,bursty:20,mixed:40``): a weighted mix of training workloads."""
    return isinstance(workloads, str) and ":" in workloads


@functools.lru_cache(maxsize=64)
def parse_mix(spec: str) -> tuple[tuple[str, float], ...]:
    """The parts of a mix and their shares (weights scaled to sum to 1). A part is a family
    (generated, paper), ``mixed``, a shipped scenario or a scenario file; ``mixed-paper`` is itself a
    mix drawn from the same numbers, so it is refused: write its parts instead."""
    from controller.scenario import ScenarioError, load_scenario

    parts: list[tuple[str, float]] = []
    for item in spec.split(","):
        name, sep, weight = item.strip().rpartition(":")
        try:
            value = float(weight)
        except ValueError:
            value = -1.0
        if not sep or not name or not value > 0 or not math.isfinite(value):
            raise MixError(f"{item.strip()!r}: each part of a mix is NAME:WEIGHT with a positive weight")
        if name == MIXED_PAPER:
            raise MixError(f"{MIXED_PAPER!r} is itself a mix: write its parts ({PAPER}:25,{MIXED}:75)")
        if name not in FAMILIES and name != MIXED:
            try:
                load_scenario(name)
            except ScenarioError as exc:
                raise MixError(f"{name!r}: not a family, 'mixed' or a scenario ({exc})") from None
        parts.append((name, value))
    total = sum(w for _, w in parts)
    return tuple((name, w / total) for name, w in parts)


@functools.lru_cache(maxsize=16)
def _scenario(name: str) -> Scenario:
    from controller.scenario import load_scenario

    return load_scenario(name)


def training_scenario(family: str, seed: int) -> Scenario:
    """A training episode's scenario: ``mixed`` a shipped one for half the seeds, else generated;
    ``mixed-paper`` the paper's setting for a quarter, else ``mixed``; a mix (:func:`parse_mix`) one
    of its parts by weight; a family draws one."""
    from controller.scenario import load_scenario, shipped_scenarios

    if is_mix(family):
        # the same draw as mixed-paper's, so that "paper:25,mixed:75" is mixed-paper episode for episode
        u = float(np.random.default_rng(np.random.SeedSequence([seed, 3])).random())
        parts = parse_mix(family)
        for name, share in parts[:-1]:
            if u < share:
                break
            u -= share
        else:
            name = parts[-1][0]
        return training_scenario(name, seed) if name in FAMILIES or name == MIXED else _scenario(name)
    if family == MIXED_PAPER:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
        return paper_scenario(seed) if rng.random() < 0.25 else training_scenario(MIXED, seed)
    if family == MIXED:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
        if rng.random() < 0.5:
            shipped = shipped_scenarios()
            return load_scenario(shipped[int(rng.integers(len(shipped)))])
        return generated_scenario(seed)
    return family_scenario(family, seed)
