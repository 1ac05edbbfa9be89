"""Calling functions over NATS: direct calls (request/reply) and durable async calls::

    async with FaasClient(nc, client="app1") as faas:
        answer = await faas.invoke("n1", "fib", b"25")          # direct: nothing is stored
        await faas.submit("n1", "fib", b"25", "r1")             # async: stored once, then run
        answer = await faas.expect("r1")                        # ... its result, when it comes
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from typing import Callable, Mapping

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError, NotFoundError

from broker import headers as H
from broker.answers import Answer, input_limit, status_of
from broker.codec import decode
from broker.connection import listen, on_event, on_publish_refused
from broker.fastpath import NatsClient, store_error
from broker.header_blocks import encode_headers, header_block
from broker.errors import BrokerUnavailable, ContractError, InvalidSubject, NodeUnavailable, NotPermitted, PayloadTooLarge
from broker.lifecycle import OnItsLoop, StartStop
from broker.messages import NodeGone
from broker.streams import async_stream, results_stream
from broker.subjects import Subjects, check_token

__all__ = ["Answer", "FaasClient", "InProcessDoor", "new_request_id"]

log = logging.getLogger(__name__)

# A node's request door in this process: (subject, reply, payload, header block) -> taken (else: NATS)
InProcessDoor = Callable[[str, str, bytes, bytes], bool]


def new_request_id() -> str:
    """32 hex digits, unique (random start, a counter): names, not secrets (docs/security.md)."""
    return f"{_ids_prefix}{next(_ids):016x}"


def _new_id_prefix() -> None:
    """A process's own start for its request ids (again in a forked child: never its parent's)."""
    global _ids_prefix, _ids
    _ids_prefix, _ids = os.urandom(8).hex(), itertools.count()


_ids_prefix, _ids = "", itertools.count()
_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)


class FaasClient(OnItsLoop, StartStop):
    def __init__(self, nc: Client, client: str = "cli", prefix: str = "faas") -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.client = check_token(client, "client")
        self.subjects = Subjects(prefix)
        self._waiting: dict[str, asyncio.Future[Answer]] = {}            # async answers by request id
        self._calls: dict[str, tuple[asyncio.Future[Answer], str, str]] = {}  # by token: (future, node, subject)
        self._stores: dict[str, asyncio.Future] = {}   # async calls' JetStream acknowledgements, by token
        self._tokens = itertools.count()
        self._inbox = ""
        self._subs: list = []
        self._unlisten: list[Callable[[], None]] = []
        self._doors: dict[str, InProcessDoor] = {}   # nodes running in this process, by id

    async def start(self) -> "FaasClient":
        self._loop = asyncio.get_running_loop()   # the connection's (OnItsLoop)
        self._inbox = self.nc.new_inbox()
        for subject, handler in ((f"{self._inbox}.*", self._on_reply),
                                 (self.subjects.results_of(self.client), self._on_answer),
                                 (self.subjects.rejects_of(self.client), self._on_answer)):
            self._subs.append(await listen(self.nc, subject, lambda subj, reply, data, headers, h=handler: h(subj, data, headers)))
        self._subs.append(await self.nc.subscribe(self.subjects.all_gone(), cb=self._on_gone))
        self._unlisten = [on_publish_refused(self.nc, self._on_refused),
                          on_event(self.nc, "disconnected", self._on_disconnected)]
        try:   # the server knows our inbox before any call: an in-process door's answer may beat a buffered SUB
            await self.nc.flush(timeout=5)
        except Exception as exc:   # not connected now: the subscriptions are sent again on reconnect
            log.info("faas client %s: subscriptions not confirmed yet: %r", self.client, exc)
        return self

    async def stop(self) -> None:
        for unlisten in self._unlisten:
            unlisten()
        self._unlisten = []
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may already be closed
                pass
        self._subs.clear()
        for fut in [*self._waiting.values(), *(entry[0] for entry in self._calls.values()), *self._stores.values()]:
            fut.cancel()
        self._waiting.clear()
        self._calls.clear()
        self._stores.clear()

    # -- direct calls -----------------------------------------------------------------
    async def invoke(self, node: str, fn: str, payload: bytes, *, req: str | None = None,
                     headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> Answer:
        """``fn`` on ``node``: its answer (any status); asyncio.TimeoutError, NodeUnavailable, NotPermitted."""
        if not self.nc.is_connected:
            raise NodeUnavailable(f"not connected to NATS: cannot reach node {node}")
        self._check_size(payload)
        subject = self.subjects.request(node, fn, self.client, req or new_request_id())
        token = str(next(self._tokens))
        loop = self.loop
        fut: asyncio.Future[Answer] = loop.create_future()
        self._calls[token] = (fut, node, subject)
        timer = loop.call_later(timeout_s, _expire, fut, timeout_s)
        try:
            reply = f"{self._inbox}.{token}"
            door = self._doors.get(node)
            if door is not None and door(subject, reply, payload, _request_block(headers, timeout_s)):
                pass   # taken in this process; the answer comes on our inbox as from afar
            elif isinstance(self.nc, NatsClient):
                self.nc.send(subject, payload, reply=reply, headers=_request_block(headers, timeout_s))
            else:
                hdrs = {H.SENT_AT: repr(time.time()), **(headers or {})}
                _say_wait(hdrs, timeout_s)
                await self.nc.publish(subject, payload, reply=reply, headers=hdrs)
            return await fut
        finally:
            timer.cancel()
            self._calls.pop(token, None)

    def open_door(self, node: str, door: "InProcessDoor") -> None:
        """Hand direct calls to ``node``, running in this process, to ``door`` (one hop less); answers still
        come on our inbox. Only code running both parts opens one: others go through the broker's rights."""
        self._doors[node] = door

    def _check_size(self, payload: bytes) -> None:
        """Refuse an input too large to travel with its headers: nats-server would close the connection."""
        limit = input_limit(self.nc.max_payload)
        if len(payload) > limit:
            raise PayloadTooLarge(f"payload of {len(payload)} bytes exceeds the limit of {limit} "
                                  f"(the broker's max_payload {self.nc.max_payload}, less room for headers)")

    def _on_reply(self, subject: str, data: bytes, headers: Mapping[str, str]) -> None:
        token = subject.rpartition(".")[2]
        entry = self._calls.pop(token, None)
        if entry is None:
            stored = self._stores.pop(token, None)
            if stored is not None and not stored.done():
                stored.set_result((data, headers))
            return
        fut, node, _ = entry
        if fut.done():
            return
        if not data and headers.get(H.NATS_STATUS) == "503":
            fut.set_exception(NodeUnavailable(f"node {node} is not running (nobody answers its requests)"))
            return
        fut.set_result(Answer(status_of(headers.get(H.STATUS)), data, headers))

    async def _on_gone(self, msg: Msg) -> None:
        try:
            gone = decode(NodeGone, msg.data)
        except ContractError:
            return
        for token, (fut, node, _) in list(self._calls.items()):
            if node == gone.node and not fut.done():
                del self._calls[token]
                fut.set_exception(NodeUnavailable(f"node {node} went away during the call ({gone.reason or 'stopped'})"))

    def _on_disconnected(self) -> None:
        """Calls in flight fail now: their answers went to an inbox nobody held meanwhile."""
        for token, (fut, node, _) in list(self._calls.items()):
            if not fut.done():
                del self._calls[token]
                fut.set_exception(NodeUnavailable(f"the connection to NATS dropped during the call to node {node}"))

    def _on_refused(self, subject: str) -> None:
        """The broker refused one of our publishes: a direct call on that subject fails now."""
        for token, (fut, _, called) in list(self._calls.items()):
            if called == subject and not fut.done():
                del self._calls[token]
                fut.set_exception(NotPermitted(f"the broker does not permit this client to call {subject}"))

    # -- async calls --------------------------------------------------------------------
    async def submit(self, node: str, fn: str, payload: bytes, req: str, headers: dict[str, str] | None = None,
                     timeout_s: float = 5.0, retry_for_s: float = 0.0) -> None:
        """Store the call durably (retried ``retry_for_s``, never doubled); answer: :meth:`expect`."""
        self._check_size(payload)
        subject = self.subjects.async_request(node, fn, self.client, req)
        hdrs = {H.MSG_ID: f"{self.client}.{req}", H.SENT_AT: repr(time.time())}
        if headers:
            hdrs.update(headers)
        loop = self.loop
        deadline = loop.time() + retry_for_s
        while True:
            attempt_s = timeout_s if retry_for_s <= 0 else max(0.5, min(timeout_s, deadline - loop.time()))
            try:
                return await self._store(subject, payload, hdrs, attempt_s)
            except (NatsTimeout, asyncio.TimeoutError, NoRespondersError, NoStreamResponseError):
                if loop.time() + 0.25 >= deadline:
                    raise
                await asyncio.sleep(0.25)

    async def _store(self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float) -> None:
        """``js.publish`` through this client's inbox, with its errors (a timer, not a task per call)."""
        token = f"s{next(self._tokens)}"
        loop = self.loop
        fut: asyncio.Future[tuple[bytes, Mapping[str, str]]] = loop.create_future()
        self._stores[token] = fut
        timer = loop.call_later(timeout_s, _expire_store, fut)
        try:
            if isinstance(self.nc, NatsClient):
                self.nc.send(subject, payload, reply=f"{self._inbox}.{token}", headers=encode_headers(headers))
            else:
                await self.nc.publish(subject, payload, reply=f"{self._inbox}.{token}", headers=headers)
            data, ack_headers = await fut
        finally:
            timer.cancel()
            self._stores.pop(token, None)
        error = store_error(data, ack_headers)
        if error is not None:
            raise error

    def expect(self, req: str) -> "asyncio.Future[Answer]":
        """A future for the answer of async call ``req`` (call it before :meth:`submit`)."""
        fut = self.loop.create_future()
        self._waiting[req] = fut
        return fut

    def forget(self, req: str) -> None:
        self._waiting.pop(req, None)

    async def call_async(self, node: str, fn: str, payload: bytes, *, req: str | None = None,
                         headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> Answer:
        """Submit durably and wait for the answer; asyncio.TimeoutError after ``timeout_s``."""
        req = req or new_request_id()
        fut = self.expect(req)
        timer = self.loop.call_later(timeout_s, _expire, fut, timeout_s)
        try:
            await self.submit(node, fn, payload, req, headers)
            return await fut
        finally:
            timer.cancel()
            self.forget(req)

    def _on_answer(self, subject: str, data: bytes, headers: Mapping[str, str]) -> None:
        try:
            kind, _, req = self.subjects.answer_ids(subject)
        except InvalidSubject:
            return
        fut = self._waiting.pop(req, None)
        if fut is None or fut.done():
            return
        try:
            fut.set_result(Answer.of_stored(kind, data))
        except ContractError as exc:
            fut.set_exception(exc)

    async def stored_answer(self, client: str, req: str) -> Answer | None:
        """A result/rejection kept in the results stream, or None; BrokerUnavailable if unreadable now."""
        for kind, subject in (("result", self.subjects.result(client, req)),
                              ("reject", self.subjects.reject(client, req))):
            try:
                raw = await self.js.get_last_msg(results_stream(self.subjects), subject)
            except NotFoundError:
                continue
            except (NatsError, asyncio.TimeoutError) as exc:   # JetStream away, busy, or no connection
                raise BrokerUnavailable(f"the stored answers cannot be read now ({type(exc).__name__}: {exc}); "
                                        "try again") from None
            return Answer.of_stored(kind, raw.data or b"")
        return None

    async def stored_call(self, client: str, req: str) -> bool:
        """Whether async call ``req`` of ``client`` is still in the intake; BrokerUnavailable if unreadable."""
        try:
            await self.js.get_last_msg(async_stream(self.subjects), self.subjects.async_call(client, req))
        except NotFoundError:
            return False
        except (NatsError, asyncio.TimeoutError) as exc:   # JetStream away, busy, or no connection
            raise BrokerUnavailable(f"the stored calls cannot be read now ({type(exc).__name__}: {exc}); "
                                    "try again") from None
        return True


_SENT_AT_LINE = f"{H.SENT_AT}: ".encode()
_WAIT_LINE = f"{H.WAIT}: ".encode()


def _request_block(headers: dict[str, str] | None, timeout_s: float) -> bytes:
    """The header block of a direct call: sent at, how long this client waits, the caller's headers."""
    if headers:
        hdrs = {H.SENT_AT: repr(time.time()), **headers}
        _say_wait(hdrs, timeout_s)
        return encode_headers(hdrs)
    wait = b"%s%r\r\n" % (_WAIT_LINE, float(timeout_s)) if math.isfinite(timeout_s) else b""
    return header_block(b"%s%r\r\n%s" % (_SENT_AT_LINE, time.time(), wait))


def _say_wait(headers: dict[str, str], timeout_s: float) -> None:
    """X-P2pfaas-Wait-Seconds: ``timeout_s``, or the caller's own value when shorter."""
    if not math.isfinite(timeout_s):
        return
    asked = headers.get(H.WAIT)
    if asked is not None:
        try:
            if float(asked) <= timeout_s:
                return
        except ValueError:
            return
    headers[H.WAIT] = repr(float(timeout_s))


def _expire_store(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(NatsTimeout())


def _expire(fut: asyncio.Future, timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError(f"no answer within {timeout_s:g} s"))
