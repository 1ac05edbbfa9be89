"""Built-in functions: echo, fib, sleep, busy and montecarlo-pi (for experiments and demos)."""

from __future__ import annotations

import random
import time

from functions.spec import CONCURRENT, FunctionInputError, FunctionSpec


def _number(payload: bytes, kind: type, low: float, high: float) -> int | float:
    try:
        value = kind(payload.decode().strip())
    except (UnicodeDecodeError, ValueError):
        raise FunctionInputError(f"expected a number, got {payload[:40]!r}") from None   # the worker names the function
    if not low <= value <= high:
        raise FunctionInputError(f"{value} is outside [{low}, {high}]")
    return value


def echo(payload: bytes) -> bytes:
    return payload


def fib(payload: bytes) -> bytes:
    """n-th Fibonacci number, computed the slow recursive way (a CPU-bound function)."""
    n = _number(payload, int, 0, 35)

    def f(k: int) -> int:
        return k if k < 2 else f(k - 1) + f(k - 2)

    return str(f(n)).encode()


def sleep(payload: bytes) -> bytes:
    """Sleep for the payload's seconds (service time for experiments)."""
    seconds = _number(payload, float, 0.0, 3600.0)
    time.sleep(seconds)
    return f"slept {seconds:.6f}".encode()


def busy(payload: bytes) -> bytes:
    """Spin the CPU for the payload's milliseconds."""
    ms = _number(payload, float, 0.0, 3_600_000.0)
    end = time.perf_counter() + ms / 1000.0
    spins = 0
    while time.perf_counter() < end:
        spins += 1
    return f"busy {ms:g} ms ({spins} spins)".encode()


def montecarlo_pi(payload: bytes) -> bytes:
    """Estimate pi from N random points (default 100000)."""
    n = _number(payload, int, 1, 100_000_000) if payload.strip() else 100_000
    rng = random.Random(n)
    inside = sum(1 for _ in range(n) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)
    return f"{4.0 * inside / n:.6f}".encode()


SPECS = (
    FunctionSpec("echo", echo, timeout_s=10.0, requires_input=False, description="returns its input",
                 concurrency=CONCURRENT, inline=True),
    FunctionSpec("fib", fib, timeout_s=60.0, description="recursive Fibonacci of n (0..35)"),
    FunctionSpec("sleep", sleep, timeout_s=3600.0, description="sleeps for the given seconds",
                 concurrency=CONCURRENT),
    FunctionSpec("busy", busy, timeout_s=3600.0, description="spins the CPU for the given ms"),
    FunctionSpec("montecarlo-pi", montecarlo_pi, timeout_s=120.0, requires_input=False, description="estimates pi from N points"),
)
