"""Carrying out a Forward: a request to ``<prefix>.<peer>.forward...``; the answer is relayed with this
node's timings in front (P2PFaaS's per-hop lists). Nobody listening: the call runs here; a peer gone or
silent fails a direct call, sends an async one round again. The call's timeout bounds its execution, not
its wait in the peer's queue: the limit counts from the peer's last :data:`PROCESSING` notice."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

import httpx
import orjson

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import codes
from broker import headers as H
from broker.answers import Answer, status_of
from broker.codec import decode
from broker.errors import ContractError
from broker.messages import NodeGone
from broker.subjects import Subjects
from nodes.answering import Answerer
from nodes.calls import Call
from nodes import peer_http
from nodes.inbox import Inbox
from nodes.peer_source import PeerSource
from nodes.settings import Timings

log = logging.getLogger(__name__)

FORWARD_GRACE_S = 5.0       # past the call's timeout plus this, a silent peer has failed it
FORWARD_FAILED = 403        # P2PFaaS: "forward failed"
PROCESSING = "102"          # X-P2pfaas-Status of an empty reply: "still holding your call" (HTTP 102)


def processing_notice() -> dict[str, str]:
    """Headers of the empty message sent on a forward's reply subject every ``forward_notice_every_s``
    while the call is held here (and when it starts late): the origin counts the call's limit from then."""
    return {H.STATUS: PROCESSING}


def due_notices(calls: Iterable[Call], now: float, every_s: float) -> list[str]:
    """Reply subjects of the forwarded calls held here silent for ``every_s`` (now marked noticed)."""
    due = []
    for call in calls:
        if call.notices and call.reply and now - (call.noticed_at or call.arrival) >= every_s:
            call.noticed_at = now
            due.append(call.reply)
    return due


async def send_notices(nc: Client, replies: list[str]) -> None:
    for reply in replies:
        try:
            await nc.publish(reply, b"", headers=processing_notice())
        except Exception as exc:  # the connection is gone: the peer's own limit applies then
            log.debug("processing notice to %s not sent: %s", reply, exc)


def refused_for_load(answer: Answer) -> bool:
    """The peer did not run the call because of its load (no room, its algorithm's refusal, it
    is stopping): not for a reason of the call's own (bad input, unknown function)."""
    return H.REJECTED_BY in answer.headers and (answer.status == 503 or answer.code == codes.CANNOT_SCHEDULE)


@dataclass(eq=False, slots=True)
class Pending:
    call: Call
    peer: str
    token: str
    timer: asyncio.TimerHandle | None


class Forwarder:
    def __init__(self, node: str, nc: Client, subjects: Subjects, inbox: Inbox, answerer: Answerer,
                 run_here: Callable[[Call], Awaitable[None]], on_forward: Callable[[str], None],
                 peers: PeerSource | None = None, timings: Timings = Timings()) -> None:
        self.node, self.nc, self.subjects, self.inbox, self.answerer = node, nc, subjects, inbox, answerer
        # a forward that heard neither answer nor notice this long was lost in transit: it fails then
        self.silent_after_s = timings.forward_silent_after_s
        self._run_here, self._on_forward = run_here, on_forward
        self.peers = peers
        self.pending: dict[int, Pending] = {}
        self._over_http: dict[asyncio.Task, tuple[Call, str]] = {}   # to P2PFaaS machines: (call, peer)
        self._failing: set[asyncio.Task] = set()   # forwards of a removed peer being answered
        self._relaying = 0                         # peers' answers being relayed to their callers
        self._back = asyncio.Event()               # a forward ended (stop() waits for all of them)
        self.on_gone: list[Callable[[str], Awaitable[None]]] = []   # told of each node that went away
        self._http_requests = itertools.count(1)
        self._sub = None

    def silence_limit(self, call: Call) -> float:
        """How long a forward may hear nothing: its timeout plus the grace, at most ``silent_after_s``."""
        return min(call.timeout_s + FORWARD_GRACE_S, self.silent_after_s)

    async def start(self) -> "Forwarder":
        self._sub = await self.nc.subscribe(self.subjects.all_gone(), cb=self._on_gone)
        return self

    async def stop(self, grace_s: float = 0.0) -> None:
        """What was forwarded gets ``grace_s`` to come back and be relayed; what is still out then is
        answered: a direct call 503, an async one handed back to be delivered again."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s if not self.nc.is_closed else 0):   # closed: nothing will come
                while self.pending or self._over_http or self._relaying:
                    self._back.clear()
                    await self._back.wait()
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone
                log.debug("unsubscribe: %s", exc)
        left = [(p.call, p.peer) for p in self.pending.values()]
        for pending in list(self.pending.values()):
            self._end(pending)
        for task, (call, peer) in list(self._over_http.items()):
            task.cancel()
            left.append((call, peer))
        await asyncio.gather(*self._over_http, *self._failing, return_exceptions=True)
        for call, peer in left:
            reason = f"node {self.node} stopped before its peer {peer} answered"
            if call.is_async:
                await self.answerer.lost(call, reason, "node_stopping")
            else:
                await self.answerer.refused(call, codes.GENERIC, 503, reason, "node_stopping", retry_after_s=1.0)

    async def forward(self, call: Call, peer: str) -> None:
        base = self.peers.http_base(peer) if self.peers is not None else None
        if base is not None:   # an original P2PFaaS node: its /peer/function route
            self._on_forward(peer)
            task = asyncio.get_running_loop().create_task(self._forward_over_http(call, peer, base))
            self._over_http[task] = (call, peer)
            task.add_done_callback(self._http_done)
            return
        await self._forward_over_nats(call, peer)

    def _http_done(self, task: asyncio.Task) -> None:
        self._over_http.pop(task, None)
        self._back.set()

    async def _forward_over_http(self, call: Call, peer: str, base: str) -> None:
        """The whole exchange is bounded (httpx's timeout bounds each read only). A machine that cannot
        carry it (refused, reset, silent) is not chosen again until it shows up."""
        assert self.peers is not None
        limit = call.timeout_s + FORWARD_GRACE_S
        try:
            if self.peers.http is None:
                raise RuntimeError("discovery has stopped (the node is stopping)")
            async with asyncio.timeout(limit):
                answer = await peer_http.forward(self.peers.http, base, call, next(self._http_requests),
                                                 node=self.node, ip=self.answerer.ip)
        except (TimeoutError, httpx.TransportError) as exc:   # refused, reset, silent: P2PFaaS's "forward failed"
            reason = (f"{peer} at {base} did not answer within {limit:g} s" if isinstance(exc, TimeoutError)
                      else f"could not reach {peer} at {base}: {exc!r}")
            self.peers.unreachable(peer, reason)
            return await self._failed(Pending(call, peer, "", None), reason)
        except Exception as exc:
            return await self._failed(Pending(call, peer, "", None), f"could not forward to {peer} at {base}: {exc!r}")
        await self.answerer.relayed(call, answer)

    async def _forward_over_nats(self, call: Call, peer: str) -> None:
        visited, ips = list(call.request.peers), list(call.peer_ips)
        ips += [""] * (len(visited) - len(ips))
        if not visited or visited[-1] != self.node:
            visited.append(self.node)
            ips.append(self.answerer.ip)
        headers = {H.HOPS: str(call.request.hops + 1), H.PEERS_LIST_ID: orjson.dumps(visited).decode(),
                   H.PEERS_LIST_IP: orjson.dumps(ips).decode(),
                   H.SCHEDULER_NAME: call.scheduler, H.TIMEOUT: repr(call.timeout_s), H.SENT_AT: repr(time.time()),
                   H.NOTICES: "true"}
        if call.deadline_s is not None:
            headers[H.DEADLINE] = repr(call.deadline_s)
        if call.wanted_until:   # what is left of the caller's wait: the peer does not run it past that
            headers[H.WAIT] = repr(max(0.001, call.wanted_until - time.time()))
        if call.request.task_type is not None:
            headers[H.TASK_TYPE] = repr(call.request.task_type)
        if call.tracing_id:
            headers[H.TRACING_ID] = call.tracing_id

        async def on_reply(msg: Msg) -> None:
            await self._on_reply(call, msg)

        token, reply = self.inbox.expect(on_reply, standing=True)   # PROCESSING notices may come first
        timer = asyncio.get_running_loop().call_later(self.silence_limit(call), self._expire, call.id)
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
        headers = msg.headers or {}
        if not msg.data and headers.get(H.STATUS) == PROCESSING:
            return await self._processing(pending)
        self._end(pending)
        self._relaying += 1
        try:
            if headers.get(H.NATS_STATUS) == "503" and not msg.data:
                log.info("%s: peer %s does not listen; running %s here", self.node, pending.peer, call.key)
                return await self._run_here(call)
            answer = Answer(status_of(headers.get(H.STATUS)), msg.data, headers)
            if call.is_async and refused_for_load(answer):
                # accepted async work is not refused because the peer was busy: it waits here
                log.debug("%s: peer %s refused %s (%s); it waits here", self.node, pending.peer, call.key,
                          answer.message)
                return await self._run_here(call)
            try:
                await self.answerer.relayed(call, answer)
            except Exception as exc:  # whatever the peer sent, the caller gets an answer
                log.warning("%s: the answer of peer %s to %s could not be relayed: %r", self.node, pending.peer,
                            call.key, exc)
                await self._failed(pending, f"peer {pending.peer} answered something unreadable "
                                            f"({type(exc).__name__}: {exc})")
        finally:
            self._relaying -= 1
            self._back.set()

    async def _processing(self, pending: Pending) -> None:
        """The peer still holds the call (queued, or started only now): its limit counts from now."""
        call = pending.call
        if pending.timer is not None:
            pending.timer.cancel()
        pending.timer = asyncio.get_running_loop().call_later(self.silence_limit(call), self._expire, call.id)
        if call.notices and call.reply:   # it came from a peer, which waits for it too
            try:
                await self.nc.publish(call.reply, b"", headers=processing_notice())
            except Exception as exc:  # the connection is gone: that peer's own limit applies
                log.debug("%s: processing notice of %s not passed on: %s", self.node, call.key, exc)

    def _expire(self, call_id: int) -> None:
        pending = self.pending.get(call_id)
        if pending is None:
            return
        self._end(pending)
        limit = self.silence_limit(pending.call)
        reason = (f"peer {pending.peer} did not answer within {limit:g} s" if limit < self.silent_after_s else
                  f"peer {pending.peer} fell silent: neither an answer nor a notice that it still holds "
                  f"the call for {limit:g} s (lost in transit?)")
        task = asyncio.get_running_loop().create_task(self._failed(pending, reason))
        self._failing.add(task)
        task.add_done_callback(self._failing.discard)

    async def _on_gone(self, msg: Msg) -> None:
        try:
            gone = decode(NodeGone, msg.data)
        except ContractError:
            return
        await self._fail_peer(gone.node, f"peer {gone.node} went away during the call ({gone.reason or 'stopped'})")
        for listener in self.on_gone:
            await listener(gone.node)

    def peer_removed(self, peer: str) -> None:
        """Discovery forgot ``peer`` (dead, or cut off): what was forwarded to it fails now."""
        if any(p.peer == peer for p in self.pending.values()):
            task = asyncio.get_running_loop().create_task(
                self._fail_peer(peer, f"peer {peer} stopped answering heartbeats during the call (removed by discovery)"))
            self._failing.add(task)
            task.add_done_callback(self._failing.discard)

    async def _fail_peer(self, peer: str, reason: str) -> None:
        for pending in [p for p in self.pending.values() if p.peer == peer]:
            self._end(pending)
            await self._failed(pending, reason)

    async def _failed(self, pending: Pending, reason: str) -> None:
        """Counted once, as forward_failed."""
        call = pending.call
        if call.is_async:  # delivered again: decided anew (maybe here, maybe another peer)
            return await self.answerer.lost(call, reason, "forward_failed")
        await self.answerer.refused(call, FORWARD_FAILED, 500, f"forward failed: {reason}", "forward_failed")

    def _end(self, pending: Pending) -> None:
        self.pending.pop(pending.call.id, None)
        self.inbox.forget(pending.token)
        if pending.timer is not None:
            pending.timer.cancel()
        self._back.set()
