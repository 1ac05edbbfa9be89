"""The node's one reply subscription: every request it sends (a call to a worker, a forward to
a peer) gets a token on it, and the reply goes to the handler registered for that token."""

from __future__ import annotations

import itertools
import logging
from typing import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

log = logging.getLogger(__name__)

ReplyHandler = Callable[[Msg], Awaitable[None]]


class Inbox:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = ""
        self._handlers: dict[str, ReplyHandler] = {}   # one reply each
        self._standing: dict[str, ReplyHandler] = {}   # every reply until forgotten
        self._tokens = itertools.count()
        self._sub = None

    async def start(self) -> "Inbox":
        self.prefix = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(f"{self.prefix}.*", cb=self._on_reply)
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
        """(token, reply subject) for one request; its first reply goes to ``handler`` (every
        reply until :meth:`forget` when ``standing``: a batch answered in parts)."""
        token = str(next(self._tokens))
        (self._standing if standing else self._handlers)[token] = handler
        return token, f"{self.prefix}.{token}"

    def forget(self, token: str) -> None:
        self._handlers.pop(token, None)
        self._standing.pop(token, None)

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self.prefix) + 1:]
        handler = self._handlers.pop(token, None) or self._standing.get(token)
        if handler is None:  # late (its call already ended: timeout, worker lost)
            return
        try:
            await handler(msg)
        except Exception:  # one bad reply must not stop the node's replies
            log.exception("handling reply on %s", msg.subject)
