"""What a function prints in a worker starts with ``[fn NAME] `` on each line, so the node's log says
whose it is and ``p2pfaas logs NAME`` finds it; lines written outside any call are left as they are."""

from __future__ import annotations

import contextvars
import threading
from typing import TextIO

current_function: contextvars.ContextVar[str] = contextvars.ContextVar("p2pfaas_function", default="")
TAG = "[fn {}] "


def tag(name: str) -> str:
    return TAG.format(name)


class TaggedStream:
    """A text stream that starts every line with the tag of the function writing it (per thread:
    ``print`` writes a line in several calls)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._state = threading.local()

    def write(self, text: str) -> int:
        name = current_function.get()
        if not name or not text:
            return self._stream.write(text)
        at_start = getattr(self._state, "at_start", True)
        out = []
        for piece in text.splitlines(keepends=True):
            if at_start:
                out.append(tag(name))
            out.append(piece)
            at_start = piece.endswith("\n")
        self._state.at_start = at_start
        self._stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str):   # flush, fileno, encoding, isatty, ...
        return getattr(self._stream, name)
