"""Recorded workloads: a scenario's ``trace`` section replaces ``phases`` (and ``service_time`` when
it has durations). Formats ``azure`` (the Azure Functions 2019 public trace: one day's per-minute
invocation counts, optional duration percentiles in ms) and ``csv`` (``arrival_s``, optional
``duration_s``); docs/autoscaling.md, "Recorded traces". Nothing is downloaded."""

from __future__ import annotations

import csv
import hashlib
import math
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Any, Literal, Union

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MINUTES_PER_DAY = 1440
AZURE_KEYS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
AZURE_PERCENTILES = (0, 1, 25, 50, 75, 99, 100)
MIN_PREFIX = 6   # a function may be named by a prefix of its hash, as git names commits


class TraceError(ValueError):
    """A trace section, file or row is not usable; the message says which and why."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AzureTrace(_Model):
    format: Literal["azure"]
    invocations: str
    durations: str | None = None
    functions: list[str] = Field(default_factory=list,
                                 description="HashFunction values (or unique prefixes); empty: the busiest `top`")
    top: int = Field(default=1, ge=1)
    start_minute: int = Field(default=0, ge=0, lt=MINUTES_PER_DAY)
    minutes: int = Field(default=60, ge=1, le=MINUTES_PER_DAY)
    seconds_per_minute: float = Field(default=60.0, gt=0, description="how long one trace minute lasts in the episode")
    rate_scale: float | None = Field(default=None, gt=0, description="multiply every count by this")
    peak_rate_per_s: float | None = Field(default=None, gt=0,
                                          description="scale the counts so the busiest interval has this rate")
    duration_scale: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _window(self) -> AzureTrace:
        if self.start_minute + self.minutes > MINUTES_PER_DAY:
            raise ValueError(f"start_minute + minutes = {self.start_minute + self.minutes} exceeds the "
                             f"{MINUTES_PER_DAY} minutes of one day's file")
        if self.rate_scale is not None and self.peak_rate_per_s is not None:
            raise ValueError("give rate_scale or peak_rate_per_s, not both")
        return self


class CsvTrace(_Model):
    format: Literal["csv"]
    path: str
    start_s: float = Field(default=0.0, ge=0)
    duration_s: float | None = Field(default=None, gt=0, description="the window replayed (default: to the last arrival)")
    time_scale: float = Field(default=1.0, gt=0, description="multiply recorded times by this (0.5: twice as fast)")
    duration_scale: float = Field(default=1.0, gt=0)


Trace = Annotated[Union[AzureTrace, CsvTrace], Field(discriminator="format")]


class _Section(_Model):
    trace: Trace


def expand_trace(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """``data`` with its ``trace`` turned into phases (and a service time); paths relative to ``base``."""
    if "phases" in data:
        raise TraceError("a scenario has either `trace` or `phases`, not both")
    try:
        trace = _Section.model_validate({"trace": data["trace"]}).trace
    except ValidationError as exc:
        raise TraceError(f"invalid trace section:\n{exc}") from exc
    out = {k: v for k, v in data.items() if k != "trace"}
    if isinstance(trace, AzureTrace):
        phase, service, summary = _azure(trace, base)
    else:
        phase, service, summary = _csv(trace, base, step_s=float(data.get("step_seconds") or 1.0))
    out["phases"] = [phase]
    if "service_time" not in out:
        if service is None:
            raise TraceError("the trace has no durations: give the scenario a service_time (or the trace a durations file)")
        out["service_time"] = service
    out["description"] = "; ".join(filter(None, [out.get("description", ""), summary]))
    return out


def _path(name: str, base: Path) -> Path:
    path = Path(name).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    return path


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file")
            return header, list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a readable CSV file: {exc}") from exc


def _azure(trace: AzureTrace, base: Path) -> tuple[dict, dict | None, str]:
    path = _path(trace.invocations, base)
    header, rows = _rows(path)
    if tuple(header[:4]) != AZURE_KEYS or len(header) != 4 + MINUTES_PER_DAY:
        raise TraceError(f"{path}: not an Azure Functions invocations file (its header is "
                         f"{', '.join(AZURE_KEYS)}, 1 .. {MINUTES_PER_DAY}; this one has {len(header)} columns "
                         f"starting {', '.join(header[:4])})")
    window = slice(4 + trace.start_minute, 4 + trace.start_minute + trace.minutes)
    counts: dict[tuple[str, str, str], np.ndarray] = {}
    for line, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise TraceError(f"{path}:{line}: {len(row)} columns, the header has {len(header)}")
        try:
            counts[(row[0], row[1], row[2])] = np.array(row[window], dtype=np.int64)
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: a count is not a whole number: {exc}") from exc
    chosen = _choose(trace, counts, path)
    total = np.sum([counts[key] for key in chosen], axis=0)
    if trace.peak_rate_per_s is not None:
        peak = total.max() / trace.seconds_per_minute
        if peak == 0:
            raise TraceError(f"{path}: the chosen functions have no call in minutes {trace.start_minute + 1}.."
                             f"{trace.start_minute + trace.minutes}: nothing to scale to peak_rate_per_s")
        total = np.round(total * trace.peak_rate_per_s / peak).astype(np.int64)
    elif trace.rate_scale is not None:
        total = np.round(total * trace.rate_scale).astype(np.int64)
    phase = {"pattern": "counts", "interval_s": trace.seconds_per_minute, "counts": total.tolist()}
    service = None
    if trace.durations is not None:
        curves = _azure_durations(trace, _path(trace.durations, base), chosen, counts)
        service = {"dist": "percentiles", "curves": curves}
    names = ", ".join(key[2][:8] for key in chosen)
    summary = (f"Azure trace {path.name}, function(s) {names}, minutes {trace.start_minute + 1}.."
               f"{trace.start_minute + trace.minutes} ({int(total.sum())} calls), one minute = {trace.seconds_per_minute:g} s")
    return phase, service, summary


def _choose(trace: AzureTrace, counts: dict[tuple[str, str, str], np.ndarray], path: Path) -> list[tuple[str, str, str]]:
    if not counts:
        raise TraceError(f"{path}: no function in the file")
    if not trace.functions:
        busiest = sorted(counts, key=lambda key: -int(counts[key].sum()))
        return busiest[:trace.top]
    chosen = []
    for name in trace.functions:
        if len(name) < MIN_PREFIX:
            raise TraceError(f"function {name!r}: give at least {MIN_PREFIX} characters of its HashFunction")
        matches = [key for key in counts if key[2].startswith(name)]
        if len(matches) != 1:
            raise TraceError(f"function {name!r}: {'no' if not matches else len(matches)} HashFunction in {path.name} "
                             f"{'starts' if not matches else 'start'} with it")
        chosen.append(matches[0])
    return chosen


def _azure_durations(trace: AzureTrace, path: Path, chosen: list[tuple[str, str, str]],
                     counts: dict[tuple[str, str, str], np.ndarray]) -> list[dict]:
    header, rows = _rows(path)
    columns = [f"percentile_Average_{q}" for q in AZURE_PERCENTILES]
    missing = [c for c in (*AZURE_KEYS[:3], *columns) if c not in header]
    if missing:
        raise TraceError(f"{path}: not an Azure Functions durations file (no column {', '.join(missing)})")
    at = {name: header.index(name) for name in (*AZURE_KEYS[:3], *columns)}
    found: dict[tuple[str, str, str], list[float]] = {}
    for line, row in enumerate(rows, start=2):
        key = (row[at["HashOwner"]], row[at["HashApp"]], row[at["HashFunction"]])
        if key in chosen:
            try:
                found[key] = [float(row[at[c]]) for c in columns]
            except (ValueError, IndexError) as exc:
                raise TraceError(f"{path}:{line}: a duration is not a number: {exc}") from exc
    curves = []
    for key in chosen:
        if key not in found:
            raise TraceError(f"{path}: no durations for function {key[2][:8]}")
        calls = int(counts[key].sum())
        if calls == 0:
            continue
        ms = np.maximum.accumulate(found[key])   # a summary's rounding may dip: keep the curve monotone
        points = [[q, round(v / 1000 * trace.duration_scale, 6)] for q, v in zip(AZURE_PERCENTILES, ms)]
        curves.append({"weight": calls, "points": points})
    if not curves:
        raise TraceError(f"the chosen functions have no call in minutes {trace.start_minute + 1}.."
                         f"{trace.start_minute + trace.minutes}")
    return curves


def _csv(trace: CsvTrace, base: Path, step_s: float) -> tuple[dict, dict | None, str]:
    path = _path(trace.path, base)
    header, rows = _rows(path)
    if "arrival_s" not in header:
        raise TraceError(f"{path}: the header names no arrival_s column (it has {', '.join(header)})")
    ai = header.index("arrival_s")
    di = header.index("duration_s") if "duration_s" in header else None
    records = []
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        try:
            arrival = float(row[ai])
            duration = float(row[di]) if di is not None else 0.0
        except (ValueError, IndexError) as exc:
            raise TraceError(f"{path}:{line}: not a number: {exc}") from exc
        if not (math.isfinite(arrival) and math.isfinite(duration)) or arrival < 0 or duration < 0:
            raise TraceError(f"{path}:{line}: times must be finite and >= 0")
        records.append((arrival, duration))
    records.sort(key=lambda r: r[0])
    end = trace.start_s + trace.duration_s if trace.duration_s is not None else math.inf
    kept = [(a - trace.start_s, d) for a, d in records if trace.start_s <= a < end]
    if not kept:
        raise TraceError(f"{path}: no arrival in the window [{trace.start_s:g}, {end:g}) s")
    arrivals = [a * trace.time_scale for a, _ in kept]
    if trace.duration_s is not None:
        length = trace.duration_s * trace.time_scale
    else:   # to the last arrival, rounded up to whole control periods
        length = math.floor(arrivals[-1] / step_s + 1) * step_s
    phase: dict[str, Any] = {"pattern": "recorded", "duration_s": length, "arrivals_s": arrivals}
    service = None
    if di is not None:
        durations = [d * trace.duration_scale for _, d in kept]
        phase["durations_s"] = durations
        service = {"dist": "empirical", "values": durations}
    summary = f"recorded trace {path.name}: {len(kept)} calls over {length:g} s"
    return phase, service, summary


# --------------------------------------------------------------------------- a generated sample
def write_azure_sample(directory: Path, seed: int = 0, functions: int = 6, day: int = 1) -> tuple[Path, Path]:
    """One generated day in the Azure Functions 2019 format (diurnal, bursty and timer functions):
    the (invocations, durations) files."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    directory.mkdir(parents=True, exist_ok=True)
    minutes = np.arange(MINUTES_PER_DAY)
    kinds = ["http", "queue", "timer", "event", "http", "storage"]
    invocations = directory / f"invocations_per_function_md.anon.d{day:02d}.csv"
    durations = directory / f"function_durations_percentiles.anon.d{day:02d}.csv"
    inv_rows, dur_rows = [], []
    for i in range(functions):
        trigger = kinds[i % len(kinds)]
        owner, app, fn = (hashlib.sha256(f"{seed}/{part}/{i}".encode()).hexdigest() for part in ("owner", "app", "fn"))
        scale = float(rng.lognormal(np.log(120), 0.8))          # calls per minute, on average
        if trigger == "timer":
            period = int(rng.choice([5, 10, 15]))
            rate = np.where(minutes % period == 0, scale * period, 0.0)
        else:
            diurnal = 1 + 0.6 * np.sin(2 * np.pi * (minutes - rng.uniform(300, 600)) / MINUTES_PER_DAY)
            rate = scale * diurnal
            for _ in range(int(rng.integers(3, 9))):            # bursts: a few minutes at several times the rate
                start, length = int(rng.integers(0, MINUTES_PER_DAY - 30)), int(rng.integers(2, 20))
                rate[start:start + length] *= float(rng.uniform(2.0, 6.0))
        counts = rng.poisson(rate)
        inv_rows.append([owner, app, fn, trigger, *counts.tolist()])
        median = float(rng.lognormal(np.log(600), 0.5))           # ms
        spread = float(rng.uniform(0.25, 0.7))
        q = np.array([0.001, 0.01, 0.25, 0.5, 0.75, 0.99, 0.999])
        z = np.array([NormalDist().inv_cdf(p) for p in q])
        pct = np.round(median * np.exp(spread * z)).astype(int)
        calls = int(counts.sum())
        average = int(round(median * math.exp(spread**2 / 2)))
        dur_rows.append([owner, app, fn, average, calls, int(pct[0]), int(pct[-1]), *pct.tolist()])
    with invocations.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*AZURE_KEYS, *(str(m) for m in range(1, MINUTES_PER_DAY + 1))])
        writer.writerows(inv_rows)
    with durations.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*AZURE_KEYS[:3], "Average", "Count", "Minimum", "Maximum",
                         *(f"percentile_Average_{q}" for q in AZURE_PERCENTILES)])
        writer.writerows(dur_rows)
    return invocations, durations


def sample_scenario(directory: Path, invocations: Path, durations: Path) -> Path:
    """A scenario file replaying two hours of the sample's busiest function, one minute = 4 s."""
    scenario = {
        "name": "azure-sample",
        "step_seconds": 8.0,
        "workers": {"min": 1, "max": 24, "initial": 4},
        "cold_start_seconds": {"dist": "uniform", "low": 2.0, "high": 5.0},
        "scale_down_seconds": 1.0,
        "deadline": {"factor": 3.0, "min": 1.0},
        "trace": {"format": "azure", "invocations": invocations.name, "durations": durations.name,
                  "top": 1, "start_minute": 580, "minutes": 120, "seconds_per_minute": 4.0,
                  "peak_rate_per_s": 10.0},
    }
    path = directory / "azure-sample.json"
    path.write_bytes(orjson.dumps(scenario, option=orjson.OPT_INDENT_2))
    return path
