"""Carrying out a Forward: a request/reply to the peer's ``<prefix>.<peer>.forward...`` subject.

The peer runs the call and answers this node, which relays the answer with its own timings
in front (P2PFaaS's per-hop lists, origin first). A peer with nobody listening means the call
runs here after all; a peer that goes away mid-call (``<prefix>.<peer>.gone``) or stays silent
past the call's timeout fails a direct call at once, and sends an async one round again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import headers as H
from broker.answers import Answer
from broker.codec import decode
from broker.errors import ContractError
from broker.messages import NodeGone
from broker.subjects import Subjects
from nodes.answering import Answerer
from nodes.calls import Call
from nodes.inbox import Inbox

log = logging.getLogger(__name__)

FORWARD_GRACE_S = 5.0       # past the call's timeout plus this, a silent peer has failed it
FORWARD_FAILED = 403        # P2PFaaS: "forward failed"


@dataclass(eq=False, slots=True)
class Pending:
    call: Call
    peer: str
    token: str
    timer: asyncio.TimerHandle


class Forwarder:
    def __init__(self, node: str, nc: Client, subjects: Subjects, inbox: Inbox, answerer: Answerer,
                 run_here: Callable[[Call], Awaitable[None]], on_forward: Callable[[str], None]) -> None:
        self.node, self.nc, self.subjects, self.inbox, self.answerer = node, nc, subjects, inbox, answerer
        self._run_here, self._on_forward = run_here, on_forward
        self.pending: dict[int, Pending] = {}
        self._sub = None

    async def start(self) -> "Forwarder":
        self._sub = await self.nc.subscribe(self.subjects.all_gone(), cb=self._on_gone)
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone
                log.debug("unsubscribe: %s", exc)
        for pending in list(self.pending.values()):
            self._end(pending)

    async def forward(self, call: Call, peer: str) -> None:
        visited = list(call.request.peers) or [self.node]
        if visited[-1] != self.node:
            visited.append(self.node)
        headers = {H.HOPS: str(call.request.hops + 1), H.PEERS_LIST_ID: ",".join(visited),
                   H.SCHEDULER_NAME: call.scheduler, H.TIMEOUT: repr(call.timeout_s), H.SENT_AT: repr(time.time())}
        if call.deadline_s is not None:
            headers[H.DEADLINE] = repr(call.deadline_s)
        if call.request.task_type is not None:
            headers[H.TASK_TYPE] = repr(call.request.task_type)
        if call.tracing_id:
            headers[H.TRACING_ID] = call.tracing_id

        async def on_reply(msg: Msg) -> None:
            await self._on_reply(call, msg)

        token, reply = self.inbox.expect(on_reply)
        timer = asyncio.get_running_loop().call_later(call.timeout_s + FORWARD_GRACE_S, self._expire, call.id)
        self.pending[call.id] = Pending(call, peer, token, timer)
        self._on_forward(peer)
        subject = self.subjects.forward(peer, call.fn, call.inv.client, call.inv.request_id)
        try:
            await self.nc.publish(subject, call.payload, reply=reply, headers=headers)
        except Exception as exc:
            pending = self.pending.get(call.id)
            if pending is not None:
                self._end(pending)
                await self._failed(pending, f"could not send it to {peer}: {exc}")

    async def _on_reply(self, call: Call, msg: Msg) -> None:
        pending = self.pending.get(call.id)
        if pending is None:
            return
        self._end(pending)
        headers = msg.headers or {}
        if headers.get(H.NATS_STATUS) == "503" and not msg.data:
            log.info("%s: peer %s does not listen; running %s here", self.node, pending.peer, call.key)
            return await self._run_here(call)
        status = headers.get(H.STATUS, "200")
        await self.answerer.relayed(call, Answer(int(status) if status.isdigit() else 500, msg.data, headers))

    def _expire(self, call_id: int) -> None:
        pending = self.pending.get(call_id)
        if pending is None:
            return
        self._end(pending)
        reason = f"peer {pending.peer} did not answer within {pending.call.timeout_s + FORWARD_GRACE_S:g} s"
        asyncio.get_running_loop().create_task(self._failed(pending, reason))

    async def _on_gone(self, msg: Msg) -> None:
        try:
            gone = decode(NodeGone, msg.data)
        except ContractError:
            return
        for pending in [p for p in self.pending.values() if p.peer == gone.node]:
            self._end(pending)
            await self._failed(pending, f"peer {gone.node} went away during the call ({gone.reason or 'stopped'})")

    async def _failed(self, pending: Pending, reason: str) -> None:
        self.answerer.metrics.error("forward_failed")
        call = pending.call
        if call.is_async:  # delivered again: decided anew (maybe here, maybe another peer)
            return await self.answerer.lost(call, reason)
        await self.answerer.refused(call, FORWARD_FAILED, 500, f"forward failed: {reason}", "forward_failed")

    def _end(self, pending: Pending) -> None:
        self.pending.pop(pending.call.id, None)
        self.inbox.forget(pending.token)
        pending.timer.cancel()
