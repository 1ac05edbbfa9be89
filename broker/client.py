"""Calling functions over NATS: submit durably, wait for the result or rejection.

Used by ``p2pfaas invoke --via nats``, the HTTP bridge and the benchmarks::

    async with FaasClient(nc, client="app1") as faas:
        answer = await faas.invoke("n1", "fib", b"25")
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from broker import headers as H
from broker.codec import decode
from broker.errors import ContractError
from broker.messages import Rejection, Result
from broker.streams import results_stream
from broker.subjects import Subjects, check_token


@dataclass(frozen=True, slots=True)
class Answer:
    """Exactly one of ``result`` / ``rejection`` is set."""

    result: Result | None = None
    rejection: Rejection | None = None

    @property
    def status(self) -> int:
        return self.result.status if self.result else self.rejection.http_status  # type: ignore[union-attr]

    @property
    def output(self) -> bytes:
        if self.result is None:
            return b""
        if self.result.output_b64 is not None:
            return base64.b64decode(self.result.output_b64)
        return (self.result.output or "").encode()


def answer_from(subject_kind: str, data: bytes) -> Answer:
    if subject_kind == "result":
        return Answer(result=decode(Result, data))
    return Answer(rejection=decode(Rejection, data))


def new_request_id() -> str:
    return uuid.uuid4().hex


class FaasClient:
    def __init__(self, nc: Client, client: str = "cli", prefix: str = "faas") -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.client = check_token(client, "client")
        self.subjects = Subjects(prefix)
        self._waiting: dict[str, asyncio.Future[Answer]] = {}
        self._subs: list = []

    async def start(self) -> "FaasClient":
        self._subs.append(await self.nc.subscribe(self.subjects.results_of(self.client), cb=self._on_answer))
        self._subs.append(await self.nc.subscribe(self.subjects.rejects_of(self.client), cb=self._on_answer))
        return self

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        for fut in self._waiting.values():
            fut.cancel()

    async def __aenter__(self) -> "FaasClient":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _on_answer(self, msg: Msg) -> None:
        kind, _, req = self.subjects.answer_ids(msg.subject)
        fut = self._waiting.pop(req, None)
        if fut is None or fut.done():
            return
        try:
            fut.set_result(answer_from(kind, msg.data))
        except ContractError as exc:
            fut.set_exception(exc)

    def expect(self, req: str) -> "asyncio.Future[Answer]":
        fut = asyncio.get_running_loop().create_future()
        self._waiting[req] = fut
        return fut

    def forget(self, req: str) -> None:
        self._waiting.pop(req, None)

    async def submit(self, node: str, fn: str, payload: bytes, req: str, headers: dict[str, str] | None = None,
                     timeout_s: float = 5.0) -> None:
        """Durably publish the request (returns once JetStream stored it)."""
        subject = self.subjects.request(node, fn, self.client, req)
        hdrs = {H.MSG_ID: f"{self.client}.{req}", H.ARRIVAL: repr(time.time())}
        if headers:
            hdrs.update(headers)
        await self.js.publish(subject, payload, headers=hdrs, timeout=timeout_s)

    async def invoke(self, node: str, fn: str, payload: bytes, *, req: str | None = None,
                     headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> Answer:
        """Submit and wait for the answer; asyncio.TimeoutError after ``timeout_s``."""
        req = req or new_request_id()
        fut = self.expect(req)
        try:
            await self.submit(node, fn, payload, req, headers)
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self.forget(req)

    async def stored_answer(self, client: str, req: str) -> Answer | None:
        """A result/rejection kept in the results stream (bounded age), or None."""
        for kind, subject in (("result", self.subjects.result(client, req)),
                              ("reject", self.subjects.reject(client, req))):
            try:
                raw = await self.js.get_last_msg(results_stream(self.subjects), subject)
            except NotFoundError:
                continue
            return answer_from(kind, raw.data or b"")
        return None
