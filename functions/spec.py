"""A function as a worker runs it: bytes in, bytes out, with how it may be run. Below the
registry and the function kinds it holds (built-ins, images), which all speak of it."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Awaitable, Callable

FunctionBody = Callable[[bytes], bytes] | Callable[[bytes], Awaitable[bytes]]
CONCURRENT = 64   # calls one worker process runs at once for an I/O-bound or async function
MAX_RETRY_DELAY_S = 3600.0


class FunctionInputError(ValueError):
    """Raised by a function whose input is malformed: the caller gets 400, not 500."""


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """A function and how a worker process may run it. ``concurrency``: calls one worker runs at once,
    1 for CPU-bound functions, more for I/O-bound (threads) and ``async def`` ones (tasks); ``inline``:
    run on the worker's event loop, no thread hop. A node never runs more than K calls at once."""

    name: str
    body: FunctionBody
    timeout_s: float = 30.0
    requires_input: bool = True   # an empty payload is refused with 400
    description: str = ""
    concurrency: int = 1
    inline: bool = False
    retry_backoff_s: tuple[float, ...] = ()   # seconds before each retry of a lost task (empty: the node's)
    is_async: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"{self.name}: concurrency must be >= 1, got {self.concurrency}")
        if not all(isinstance(d, (int, float)) and 0 < d <= MAX_RETRY_DELAY_S for d in self.retry_backoff_s):
            raise ValueError(f"{self.name}: retry_backoff_s must be seconds in (0, {MAX_RETRY_DELAY_S:g}], "
                             f"got {self.retry_backoff_s!r}")
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.body))
