"""Autoscaling scenarios: a user-writable JSON (or YAML) farm and workload: worker bounds, cold-start
and scale-down delays, service times, deadlines and arrival phases (Poisson, sampled by thinning)."""

from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from controller.distributions import MEAN_SAMPLES, Delay, ServiceTime

SCENARIO_DIR = Path(__file__).with_name("scenarios")


class ScenarioError(ValueError):
    """A scenario name, file or field is not usable; the message says which and why."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- arrival phases
class _Phase(_Model):
    duration_s: float = Field(gt=0)
    rate_per_s: float = Field(ge=0)

    @property
    def peak_rate(self) -> float:
        return self.rate_per_s

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """Arrival rate at ``t`` seconds since the phase started."""
        return np.full(np.shape(t), self.rate_per_s)

    def arrivals(self, rng: np.random.Generator, length: float) -> np.ndarray:
        """Sorted arrival times in ``[0, length)``: Poisson with rate ``rate_at``, by thinning."""
        peak = self.peak_rate
        n = rng.poisson(peak * length) if peak > 0 else 0
        t = np.sort(rng.uniform(0.0, length, n))
        keep = rng.uniform(0.0, peak, n) < self.rate_at(t)
        return t[keep]

    def durations(self, count: int) -> np.ndarray | None:
        """Recorded service times of the first ``count`` arrivals; None: drawn from the scenario's."""
        return None


class ConstantPhase(_Phase):
    pattern: Literal["constant"] = "constant"


class SinePhase(_Phase):
    """``rate_per_s + amplitude_per_s * sin(2 pi t / period_s)``."""

    pattern: Literal["sine"]
    amplitude_per_s: float = Field(ge=0)
    period_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _non_negative(self) -> SinePhase:
        if self.amplitude_per_s > self.rate_per_s:
            raise ValueError("amplitude_per_s exceeds rate_per_s: the rate would go negative")
        return self

    @property
    def peak_rate(self) -> float:
        return self.rate_per_s + self.amplitude_per_s

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        return self.rate_per_s + self.amplitude_per_s * np.sin(2 * np.pi * np.asarray(t) / self.period_s)


class SpikePhase(_Phase):
    """``rate_per_s``, except ``spike_rate_per_s`` during ``[spike_start_s, +spike_duration_s)``."""

    pattern: Literal["spike"]
    spike_rate_per_s: float = Field(ge=0)
    spike_start_s: float = Field(ge=0)
    spike_duration_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _inside(self) -> SpikePhase:
        if self.spike_start_s + self.spike_duration_s > self.duration_s:
            raise ValueError("the spike ends after the phase does (spike_start_s + spike_duration_s > duration_s)")
        return self

    @property
    def peak_rate(self) -> float:
        return max(self.rate_per_s, self.spike_rate_per_s)

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t)
        spiking = (t >= self.spike_start_s) & (t < self.spike_start_s + self.spike_duration_s)
        return np.where(spiking, self.spike_rate_per_s, self.rate_per_s)


class CountsPhase(_Model):
    """Exactly ``counts[i]`` arrivals in interval ``i`` (a trace's per-minute counts), at uniform times."""

    pattern: Literal["counts"]
    interval_s: float = Field(gt=0)
    counts: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)

    @property
    def duration_s(self) -> float:
        return self.interval_s * len(self.counts)

    @property
    def peak_rate(self) -> float:
        return max(self.counts) / self.interval_s

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        index = np.clip((t // self.interval_s).astype(int), 0, len(self.counts) - 1)
        inside = (t >= 0) & (t < self.duration_s)
        return np.where(inside, np.asarray(self.counts)[index] / self.interval_s, 0.0)

    def arrivals(self, rng: np.random.Generator, length: float) -> np.ndarray:
        counts = np.asarray(self.counts)
        starts = np.arange(len(counts)) * self.interval_s
        t = np.sort(np.repeat(starts, counts) + rng.uniform(0.0, self.interval_s, int(counts.sum())))
        return t[t < length]

    def durations(self, count: int) -> np.ndarray | None:
        return None


class RecordedPhase(_Model):
    """Recorded arrivals (and service times if recorded), replayed the same in every episode."""

    pattern: Literal["recorded"]
    duration_s: float = Field(gt=0)
    arrivals_s: list[float]
    durations_s: list[Annotated[float, Field(ge=0)]] | None = None
    rate_bin_s: float = Field(default=1.0, gt=0, description="the width of the bins rate_at counts arrivals in")

    @model_validator(mode="after")
    def _consistent(self) -> RecordedPhase:
        t = self.arrivals_s
        if any(b < a for a, b in zip(t, t[1:])):
            raise ValueError("arrivals_s must be sorted")
        if t and (t[0] < 0 or t[-1] >= self.duration_s):
            raise ValueError(f"arrivals_s must lie in [0, duration_s = {self.duration_s:g})")
        if self.durations_s is not None and len(self.durations_s) != len(t):
            raise ValueError(f"durations_s has {len(self.durations_s)} values for {len(t)} arrivals")
        return self

    @cached_property
    def _rates(self) -> np.ndarray:
        bins = max(1, math.ceil(self.duration_s / self.rate_bin_s))
        counts = np.bincount((np.asarray(self.arrivals_s) // self.rate_bin_s).astype(int), minlength=bins)
        return counts[:bins] / self.rate_bin_s

    @property
    def peak_rate(self) -> float:
        return float(self._rates.max())

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        index = np.clip((t // self.rate_bin_s).astype(int), 0, len(self._rates) - 1)
        return np.where((t >= 0) & (t < self.duration_s), self._rates[index], 0.0)

    def arrivals(self, rng: np.random.Generator, length: float) -> np.ndarray:
        t = np.asarray(self.arrivals_s, dtype=float)
        return t[t < length]

    def durations(self, count: int) -> np.ndarray | None:
        return None if self.durations_s is None else np.asarray(self.durations_s[:count], dtype=float)


def _pattern(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("pattern", "constant")
    return getattr(value, "pattern", "constant")


Phase = Annotated[
    Union[
        Annotated[ConstantPhase, Tag("constant")],
        Annotated[SinePhase, Tag("sine")],
        Annotated[SpikePhase, Tag("spike")],
        Annotated[CountsPhase, Tag("counts")],
        Annotated[RecordedPhase, Tag("recorded")],
    ],
    Discriminator(_pattern),
]


# --------------------------------------------------------------------------- the scenario
class WorkerBounds(_Model):
    min: int = Field(ge=0)
    max: int = Field(ge=1)
    initial: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> WorkerBounds:
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"need min <= initial <= max, got {self.min} <= {self.initial} <= {self.max}")
        return self

    def clamp(self, workers: float) -> int:
        return min(self.max, max(self.min, int(workers)))


class DeadlineSpec(_Model):
    """Each task's deadline is ``factor`` x its own service time, clamped to ``[min, max]``."""

    factor: float = Field(gt=0)
    min: float = Field(default=0.0, ge=0)
    max: float | None = Field(default=None, gt=0)

    def for_service(self, service_s: np.ndarray) -> np.ndarray:
        return np.clip(self.factor * service_s, self.min, self.max if self.max is not None else np.inf)


class Scenario(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    step_seconds: float = Field(gt=0, description="control period: one decision per step")
    max_steps: int | None = Field(default=None, ge=1, description="decisions per episode (after one warm-up step)")
    workers: WorkerBounds
    cold_start_seconds: Delay = 0.0
    scale_down_seconds: Delay = 0.0
    service_time: ServiceTime
    deadline: DeadlineSpec
    phases: list[Phase] = Field(min_length=1)

    @model_validator(mode="after")
    def _horizon(self) -> Scenario:
        # The episode is one warm-up period (no decision) + max_steps decisions, all inside the phases.
        fits = int(math.floor(self.duration_s / self.step_seconds + 1e-9)) - 1
        if self.max_steps is None:
            if fits < 1:
                raise ValueError(f"phases last {self.duration_s:g} s: not enough for two steps of {self.step_seconds:g} s")
            return self.model_copy(update={"max_steps": fits})
        if self.max_steps > fits:
            raise ValueError(
                f"(max_steps + 1) x step_seconds = {(self.max_steps + 1) * self.step_seconds:g} s exceeds the "
                f"phases' total {self.duration_s:g} s (one warm-up step precedes the decisions); "
                f"use max_steps <= {max(fits, 0)} or longer phases"
            )
        return self

    @property
    def steps(self) -> int:
        """``max_steps``, defaulted from the phases."""
        assert self.max_steps is not None
        return self.max_steps

    @property
    def duration_s(self) -> float:
        return float(sum(p.duration_s for p in self.phases))

    @property
    def episode_seconds(self) -> float:
        """Simulated time of one episode: the warm-up step plus ``max_steps`` steps."""
        return (self.steps + 1) * self.step_seconds

    @property
    def mean_service_s(self) -> float:
        return self.service_time.mean_s

    @cached_property
    def mean_deadline_s(self) -> float:
        draws = self.service_time.sample(np.random.default_rng(0), MEAN_SAMPLES)
        return float(self.deadline.for_service(draws).mean())

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """Arrival rate (tasks/s) at episode times ``t``; 0 after the last phase."""
        t = np.asarray(t, dtype=float)
        rate = np.zeros_like(t)
        start = 0.0
        for phase in self.phases:
            inside = (t >= start) & (t < start + phase.duration_s)
            rate = np.where(inside, phase.rate_at(t - start), rate)
            start += phase.duration_s
        return rate

    def _arrivals(self, rng: np.random.Generator, horizon_s: float) -> list[tuple[np.ndarray, np.ndarray | None]]:
        chunks, start = [], 0.0
        for phase in self.phases:
            if start >= horizon_s:
                break
            t = phase.arrivals(rng, min(phase.duration_s, horizon_s - start))
            chunks.append((start + t, phase.durations(len(t))))
            start += phase.duration_s
        return chunks

    def sample_arrivals(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        """Sorted arrival times in ``[0, horizon_s)``."""
        chunks = [t for t, _ in self._arrivals(rng, horizon_s)]
        return np.concatenate(chunks) if chunks else np.empty(0)

    def sample_tasks(self, rng: np.random.Generator, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Arrival and service times of an episode's tasks (a recorded phase's own service times kept)."""
        chunks = self._arrivals(rng, horizon_s)
        arrivals = np.concatenate([t for t, _ in chunks]) if chunks else np.empty(0)
        service = self.service_time.sample(rng, len(arrivals))
        offset = 0
        for t, recorded in chunks:
            if recorded is not None:
                service[offset:offset + len(t)] = recorded
            offset += len(t)
        return arrivals, service


# --------------------------------------------------------------------------- loading
def shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.json"))


def _read(path: Path) -> Any:
    text = path.read_bytes()
    if path.suffix.lower() in {".yaml", ".yml"}:
        try:
            import yaml
        except ImportError as exc:
            raise ScenarioError(f"{path}: YAML scenarios need pyyaml (pip install pyyaml), or use JSON") from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not valid JSON: {exc}") from exc


def load_scenario(name_or_path: str | Path | Scenario) -> Scenario:
    """A shipped scenario by name (``"bursty"``) or a scenario file by path; a ``Scenario`` passes through."""
    if isinstance(name_or_path, Scenario):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    looks_like_file = path.suffix.lower() in {".json", ".yaml", ".yml"} or "/" in text or path.exists()
    if not looks_like_file:
        path = SCENARIO_DIR / f"{text}.json"
        if not path.is_file():
            raise ScenarioError(f"unknown scenario {text!r}; shipped: {', '.join(shipped_scenarios())}, or give a file path")
    elif not path.is_file():
        raise ScenarioError(f"{path}: no such scenario file")
    data = _read(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario is a JSON object, got {type(data).__name__}")
    if "trace" in data:
        from controller.traces import TraceError, expand_trace

        try:
            data = expand_trace(data, path.parent)
        except TraceError as exc:
            raise ScenarioError(f"{path}: {exc}") from exc
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{path}: invalid scenario:\n{exc}") from exc
