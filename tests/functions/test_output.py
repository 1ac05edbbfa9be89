"""A function's output is tagged with its name, line by line, in threads and tasks alike."""

from __future__ import annotations

import asyncio
import contextvars
import io
from concurrent.futures import ThreadPoolExecutor

from functions.output import TaggedStream, current_function


def test_every_line_a_function_prints_starts_with_its_name():
    out = io.StringIO()
    stream = TaggedStream(out)
    print("imported", file=stream)   # outside any call: as it is

    def fn(payload: str) -> None:
        print(payload, file=stream)
        stream.write("two\nlines\n")

    async def call(name: str, pool: ThreadPoolExecutor) -> None:
        current_function.set(name)
        await asyncio.get_running_loop().run_in_executor(pool, contextvars.copy_context().run, fn, name)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            await asyncio.gather(call("greet", pool), call("shout", pool))

    asyncio.run(main())
    lines = out.getvalue().splitlines()
    assert lines[0] == "imported"
    assert sorted(lines[1:]) == sorted(["[fn greet] greet", "[fn greet] two", "[fn greet] lines",
                                        "[fn shout] shout", "[fn shout] two", "[fn shout] lines"])
    assert stream.getvalue() == out.getvalue()   # the rest of the stream's API is the stream's
