"""Service-time and delay distributions of a scenario, clamped to ``min``/``max``."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

MEAN_SAMPLES = 200_000  # draws used to compute the mean of a clamped distribution


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Clamped(_Model):
    min: float = Field(default=0.0, ge=0)
    max: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> _Clamped:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.clip(self._draw(rng, size), self.min, self.max if self.max is not None else np.inf)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raise NotImplementedError

    def _unclamped_mean(self) -> float:
        raise NotImplementedError

    @cached_property
    def mean_s(self) -> float:
        """Mean of the clamped distribution (exact without clamping, else a fixed-seed estimate)."""
        if self.min == 0.0 and self.max is None:
            return self._unclamped_mean()
        return float(self.sample(np.random.default_rng(0), MEAN_SAMPLES).mean())


class ConstantDist(_Clamped):
    dist: Literal["constant"]
    value: float = Field(ge=0)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, self.value)

    def _unclamped_mean(self) -> float:
        return self.value


class UniformDist(_Clamped):
    dist: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _low_high(self) -> UniformDist:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.uniform(self.low, self.high, size)

    def _unclamped_mean(self) -> float:
        return (self.low + self.high) / 2


class ExponentialDist(_Clamped):
    dist: Literal["exponential"]
    mean: float = Field(gt=0)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.exponential(self.mean, size)

    def _unclamped_mean(self) -> float:
        return self.mean


class GammaDist(_Clamped):
    dist: Literal["gamma"]
    shape: float = Field(gt=0)
    scale: float = Field(gt=0)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.gamma(self.shape, self.scale, size)

    def _unclamped_mean(self) -> float:
        return self.shape * self.scale


class LognormalDist(_Clamped):
    """``exp(N(mu, sigma))``, numpy's parametrisation: the median is ``exp(mu)``."""

    dist: Literal["lognormal"]
    mu: float
    sigma: float = Field(ge=0)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, size)

    def _unclamped_mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)


class PercentileCurve(_Model):
    """Service times as ``[[percentile, seconds], ...]`` from 0 to 100, interpolated linearly."""

    weight: float = Field(default=1.0, gt=0)
    points: list[tuple[float, float]] = Field(min_length=2)

    @model_validator(mode="after")
    def _monotone(self) -> PercentileCurve:
        qs, values = zip(*self.points)
        if qs[0] != 0 or qs[-1] != 100 or any(b <= a for a, b in zip(qs, qs[1:])):
            raise ValueError(f"percentiles must rise strictly from 0 to 100, got {list(qs)}")
        if min(values) < 0 or any(b < a for a, b in zip(values, values[1:])):
            raise ValueError(f"service times must be >= 0 and never fall as the percentile rises, got {list(values)}")
        return self

    def mean(self) -> float:
        """The area under the quantile function."""
        return sum((q1 - q0) / 100 * (v0 + v1) / 2 for (q0, v0), (q1, v1) in zip(self.points, self.points[1:]))


class PercentilesDist(_Clamped):
    """A mixture of percentile curves (several functions of a trace), each as likely as its weight."""

    dist: Literal["percentiles"]
    curves: list[PercentileCurve] = Field(min_length=1)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        weights = np.array([c.weight for c in self.curves])
        which = rng.choice(len(self.curves), size, p=weights / weights.sum())
        u = rng.uniform(0.0, 100.0, size)
        out = np.empty(size)
        for i, curve in enumerate(self.curves):
            qs, values = zip(*curve.points)
            mask = which == i
            out[mask] = np.interp(u[mask], qs, values)
        return out

    def _unclamped_mean(self) -> float:
        total = sum(c.weight for c in self.curves)
        return sum(c.weight * c.mean() for c in self.curves) / total


class EmpiricalDist(_Clamped):
    """Recorded service times, drawn with replacement."""

    dist: Literal["empirical"]
    values: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values), size)

    def _unclamped_mean(self) -> float:
        return float(np.mean(self.values))


ServiceTime = Annotated[
    Union[GammaDist, ExponentialDist, LognormalDist, ConstantDist, UniformDist, PercentilesDist, EmpiricalDist],
    Field(discriminator="dist"),
]
DelayDist = Annotated[Union[UniformDist, ConstantDist], Field(discriminator="dist")]
Delay = Union[Annotated[float, Field(ge=0)], DelayDist]


def sample_delay(delay: Delay, rng: np.random.Generator) -> float:
    if isinstance(delay, (int, float)):
        return float(delay)
    return float(delay.sample(rng, 1)[0])
