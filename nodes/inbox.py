"""The node's one reply subscription: every request it sends gets a token on it, and the reply
goes to that token's handler, in the connection's read loop (a returned coroutine runs as a task)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Awaitable, Callable, Mapping

from nats.aio.client import Client

from broker.connection import listen
from broker.lifecycle import Tasks

log = logging.getLogger(__name__)


class Reply:
    """One reply: what its handler reads (a ``Msg``'s ``subject``, ``data`` and ``headers``)."""

    __slots__ = ("subject", "data", "headers")

    def __init__(self, subject: str, data: bytes, headers: Mapping[str, str]) -> None:
        self.subject, self.data, self.headers = subject, data, headers


ReplyHandler = Callable[[Reply], "Awaitable[None] | None"]


class Inbox:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = ""
        self._handlers: dict[str, ReplyHandler] = {}   # one reply each
        self._standing: dict[str, ReplyHandler] = {}   # every reply until forgotten
        self._tokens = itertools.count()
        self._sub = None
        self._running = Tasks("handling a reply", log)

    async def start(self) -> "Inbox":
        self.prefix = self.nc.new_inbox()
        self._sub = await listen(self.nc, f"{self.prefix}.*", self._on_reply)
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone
                log.debug("inbox unsubscribe: %s", exc)
        self._handlers.clear()
        self._standing.clear()

    def expect(self, handler: ReplyHandler, *, standing: bool = False) -> tuple[str, str]:
        """(token, reply subject) for one request; its first reply goes to ``handler`` (all, if ``standing``)."""
        token = str(next(self._tokens))
        (self._standing if standing else self._handlers)[token] = handler
        return token, f"{self.prefix}.{token}"

    async def ask(self, subject: str, data: bytes, *, timeout_s: float, tries: int = 1,
                  wanted: Callable[[], bool] = lambda: True) -> Reply | None:
        """A request through this inbox, asked again with a growing pause while nobody answers and
        ``wanted()``; None if nobody ever answered with a body (any failure counts as no answer)."""
        loop = asyncio.get_running_loop()
        delay = 0.5
        for attempt in range(tries):
            if not wanted():
                return None
            answer: asyncio.Future[Reply] = loop.create_future()

            def on_reply(msg: Reply, answer=answer) -> None:
                if not answer.done():
                    answer.set_result(msg)

            token, reply = self.expect(on_reply)
            try:
                await self.nc.publish(subject, data, reply=reply)
                async with asyncio.timeout(timeout_s):
                    msg = await answer
                if msg.data:
                    return msg
            except Exception as exc:  # no answer yet: the other side (or our connection) may be reconnecting
                log.debug("asking %s: %r", subject, exc)
            finally:
                self.forget(token)
            if attempt + 1 < tries:
                await asyncio.sleep(delay)
                delay = min(2 * delay, 4.0)
        return None

    def forget(self, token: str) -> None:
        self._handlers.pop(token, None)
        self._standing.pop(token, None)

    def _on_reply(self, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> None:
        token = subject[len(self.prefix) + 1:]
        handler = self._handlers.pop(token, None) or self._standing.get(token)
        if handler is None:  # late (its call already ended: timeout, worker lost)
            return
        try:
            pending = handler(Reply(subject, data, headers))
        except Exception:  # one bad reply must not stop the node's replies
            log.exception("handling reply on %s", subject)
            return
        if pending is not None:
            self._running.spawn(pending)
