"""Answering calls: a direct call (or a peer's forward) on its reply subject with the P2PFaaS headers;
an async call stored on its result/reject subject once per request id, and only then its intake
message acknowledged (a failed store is retried in a task). Every answer is counted here and
offered to the LearningScheduler's rewards."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NoStreamResponseError

from broker import codes
from broker import headers as H
from broker.answers import VERSION, Answer, seconds_text, answer_headers, context_headers, error_body, output_limit, render_direct
from broker.codec import encode
from broker.fastpath import ack_now, store_error
from broker.header_blocks import header_block, header_text
from broker.lifecycle import OnItsLoop
from broker.messages import DirectAnswer, HopTiming, Rejection, Result, WorkerOutcome
from broker.streams import StreamRemaker, deadletter_stream, results_stream
from broker.subjects import Subjects
from functions.registry import FunctionRegistry
from nodes.calls import Call, output_fields, result_document, timings_of
from nodes.drops import DropSummary, unrun_reason
from nodes.inbox import Inbox, Reply
from nodes.metrics import NodeMetrics
from nodes.settings import Timings
from nodes.telemetry import PoolStats

log = logging.getLogger(__name__)

STORE_TIMEOUT_S = 5.0


class Answerer(OnItsLoop):
    def __init__(self, node: str, nc: Client, subjects: Subjects, metrics: NodeMetrics,
                 stats_of: Callable[[str], PoolStats | None], inbox: Inbox, *, registry: FunctionRegistry | None = None,
                 retry_backoff_s: Sequence[float] = (1.0,), ip: str = "", timings: Timings = Timings()) -> None:
        self.node, self.nc, self.js, self.subjects = node, nc, nc.jetstream(), subjects
        self.inbox = inbox
        self.ip = ip   # this node's IP address, as P2PFaaS lists it (X-P2pfaas-Peers-List-Ip)
        self._executed_by = header_text({H.EXECUTED_BY: node}) if node else ""
        self._plain_lines: dict[str, str] = {}   # scheduler -> its answers' first lines (_context_text)
        self.metrics = metrics
        self.stats_of = stats_of
        self.dropped = DropSummary(node, timings.dropped_log_every_s)   # calls not run: a log line per window, not per call
        self.on_answer: Callable[[str, int, float], None] | None = None   # (key, status, total_s): rewards
        self._stores: set[asyncio.Task] = set()                        # stores being retried
        self._acking: dict[str, tuple[Call, asyncio.TimerHandle]] = {}   # stores awaiting their ack, by token
        self._results_stream = results_stream(subjects)
        self._expected_stream = header_text({H.EXPECTED_STREAM: self._results_stream})
        self._stopping = False
        self.unstored = 0   # answers waiting for JetStream to take them (disk full, broker away)
        self._remake = StreamRemaker(self.js, subjects, node)
        self.registry = registry                         # the functions' own retry back-off
        self.retry_backoff_s = tuple(retry_backoff_s)    # ... else the node's (NodeSettings)

    # -- outcomes -----------------------------------------------------------------------
    def ended(self, call: Call, outcome: WorkerOutcome, output: bytes) -> None:
        """A worker's outcome: only counted when the worker answered the direct caller itself."""
        if outcome.answered:
            return self.count_execution(call, outcome.status, outcome.execution_s)
        self.executed(call, outcome.status, output, outcome.error, outcome.execution_s)

    def executed(self, call: Call, status: int, output: bytes, error: str | None, execution_s: float) -> None:
        """The call ran (or failed) here: the answer is sent, or its store started."""
        limit = self.output_limit()
        if len(output) > limit:   # it could never be sent (nor stored): an error the caller can read instead
            status, error, output = 500, f"{call.fn}: output of {len(output)} bytes exceeds the limit of {limit}", b""
        self.count_execution(call, status, execution_s)
        if not call.is_async:
            context = DirectAnswer.model_construct(reply=call.reply, arrival=call.arrival, headers=self._context_text(call))
            body, block = render_direct(context, status, output, error, execution_s)
            try:
                return self.nc.send(call.reply, body, headers=block)
            except Exception as exc:  # the caller cannot be reached any more
                log.warning("%s: answer to %s not sent: %s", self.node, call.key, exc)
                return
        total_s = time.time() - call.arrival
        self._store(call, self.subjects.result(call.inv.client, call.inv.request_id),
                          orjson.dumps(result_document(call, self.node, self.ip, status, error, execution_s, total_s,
                                                       output if status == 200 else b"")))

    def output_limit(self) -> int:
        """Largest output an answer can carry: the message limit less headers, and base64 for a stored one."""
        return output_limit(self.nc.max_payload)

    def direct_context(self, call: Call) -> dict | None:
        """A direct call's :class:`DirectAnswer` document, handed to the worker that answers the
        caller itself; None for an async call, whose answer we store."""
        if call.is_async:
            return None
        return {"reply": call.reply, "arrival": call.arrival, "headers": self._context_text(call)}

    def _context_text(self, call: Call) -> str:
        """The node's side of a direct answer's P2PFaaS headers as header lines: what
        :func:`~broker.answers.context_headers` says, in one pass for the common call (a hot path)."""
        forwarded = call.request.external
        if not forwarded and not call.probing_s and call.learning is None and not call.cold_start_s:
            lines = self._plain_lines.get(call.scheduler)
            if lines is None:
                lines = header_text({H.VERSION: VERSION, H.SCHEDULER: call.scheduler})
                if len(self._plain_lines) < 64:
                    self._plain_lines[call.scheduler] = lines
            transit = f"{H.TIMING_TRANSIT}: {seconds_text(call.transit_s)}\r\n" if call.transit_s else ""
            return (f"{lines}{H.TIMING_SCHEDULING}: {orjson.dumps([round(call.scheduling_s, 6)]).decode()}\r\n"
                    f"{H.TIMING_QUEUEING}: {seconds_text(call.queueing_s)}\r\n{transit}{self._executed_by}")
        return header_text(context_headers(
            scheduler=call.scheduler, executed_by=self.node, scheduling=(call.scheduling_s,), probing=(call.probing_s,),
            queueing_s=call.queueing_s, transit_s=call.transit_s, forwards=call.request.hops if forwarded else 0,
            peers=[*call.request.peers, self.node] if forwarded else (),
            peer_ips=[*call.peer_ips, *[""] * (len(call.request.peers) - len(call.peer_ips)), self.ip] if forwarded else (),
            learning=call.learning, cold_start_s=call.cold_start_s))

    def count_execution(self, call: Call, status: int, execution_s: float) -> None:
        """Metrics, pool telemetry and rewards of a call a worker ran (whoever answered it)."""
        total_s = time.time() - call.arrival
        self._count(call, status, execution_s, total_s)
        stats = self.stats_of(call.pool)
        if stats is not None:
            stats.completed(total_s, call.deadline_s, status == 200)

    async def unrun(self, calls: list[Call], expected_s: dict[str, float]) -> None:
        """Queued calls taken out unrun, their callers gone or about to be: told 504 at once, one log line per window."""
        now = time.time()
        for call in calls:
            reason, kind = unrun_reason(call, now, expected_s.get(call.fn, 0.0))
            self.dropped.add(kind, reason)
            self.count_unrun(call)
            await self.refused(call, codes.GENERIC, 504, reason, kind, retry_after_s=1.0, logged=False)

    def count_unrun(self, call: Call) -> None:
        """Pool telemetry of an admitted call taken out of its queue unrun: it did not meet its QoS."""
        stats = self.stats_of(call.pool)
        if stats is not None:
            stats.completed(time.time() - call.arrival, call.deadline_s, False)

    async def relayed(self, call: Call, answer: Answer) -> None:
        """A peer answered a call this node forwarded: this node's timings go in front of its own."""
        total_s = time.time() - call.arrival
        hops = [HopTiming(node=self.node, arrival=call.arrival, scheduling_s=call.scheduling_s,
                          probing_s=call.probing_s, total_s=total_s), *answer.hop_timings]
        timings = answer.timings
        self._count(call, answer.status, timings.execution_s, total_s)
        if call.is_async and H.REJECTED_BY in answer.headers:   # the peer refused it: a rejection, as here
            rejection = Rejection(request_id=call.inv.request_id, client=call.inv.client, fn=call.fn, code=answer.code,
                                  http_status=answer.status, reason=answer.message,
                                  node=answer.headers[H.REJECTED_BY], scheduler=call.scheduler, learning=call.learning)
            return self._store(call, self.subjects.reject(call.inv.client, call.inv.request_id), encode(rejection))
        if call.is_async:
            error = answer.error
            result = Result(request_id=call.inv.request_id, client=call.inv.client, fn=call.fn, status=answer.status,
                            error=error.message if error else None, executed_by=answer.executed_by or "?",
                            origin=self.node, hops=answer.hops, peers=answer.peers, peer_ips=answer.peer_ips,
                            scheduler=call.scheduler,
                            timings=timings_of(call, timings.execution_s, total_s, timings.queueing_s),
                            hop_timings=hops, learning=call.learning, **output_fields(answer.output))
            return self._store(call, self.subjects.result(call.inv.client, call.inv.request_id), encode(result))
        headers = {k: v for k, v in answer.headers.items() if k not in H.LEARNING}
        headers[H.SCHEDULER] = call.scheduler   # P2PFaaS reports the origin's algorithm
        if H.TIMING_TOTAL in headers:           # the peer ran it: this node's timings go in front
            headers.update(answer_headers(status=answer.status, scheduler=call.scheduler, executed_by=answer.executed_by,
                                          hops=hops, execution_s=timings.execution_s, queueing_s=timings.queueing_s,
                                          transit_s=call.transit_s, forwards=answer.hops, peers=answer.peers,
                                          peer_ips=answer.peer_ips))
        if call.learning is not None:
            headers.update(call.learning.headers())
        await self._reply(call, answer.body, headers)

    async def refused(self, call: Call, code: int, http_status: int, reason: str, kind: str, *,
                      retry_after_s: float | None = None, logged: bool = True) -> None:
        """The call is not run: rejected by the algorithm (``kind`` "rejected") or refused as bad input
        (``logged`` False: the caller logs a summary instead of a line per call)."""
        if kind == "rejected":
            self.metrics.request(call.fn, "rejected")
        else:
            self.metrics.error(kind)
            if logged:
                log.warning("%s: refused %s (%s): %s", self.node, call.key, kind, reason)
        if self.on_answer is not None:
            self.on_answer(call.key, http_status, time.time() - call.arrival)
        if call.is_async:
            rejection = Rejection(request_id=call.inv.request_id, client=call.inv.client, fn=call.fn, code=code,
                                  http_status=http_status, reason=reason, node=self.node,
                                  retry_after_s=retry_after_s, scheduler=call.scheduler, learning=call.learning)
            return self._store(call, self.subjects.reject(call.inv.client, call.inv.request_id), encode(rejection))
        headers = {H.STATUS: str(http_status), H.SCHEDULER: call.scheduler, H.REJECTED_BY: self.node}
        if retry_after_s is not None:
            headers[H.RETRY_AFTER] = str(max(1, round(retry_after_s)))
        if call.learning is not None:
            headers.update(call.learning.headers())
        await self._reply(call, error_body(code, reason), headers)

    async def lost(self, call: Call, reason: str, kind: str = "worker_lost") -> None:
        """The worker (or peer) running the call went away: a direct call fails now, an async one is
        delivered again (dead-lettered on its last try). Counted once, as ``kind``."""
        log.warning("%s: %s lost: %s", self.node, call.key, reason)
        self.metrics.error(kind)
        if not call.is_async:
            return self.executed(call, 500, b"", f"{call.fn} was not completed: {reason}", 0.0)
        assert call.held is not None
        delay = self.retry_delay_s(call)
        try:  # the intake dead-letters it on its last delivery, before running it
            await call.held.nak(delay=delay)
            log.info("%s: %s delivered again in %g s (retry %d)", self.node, call.key, delay, call.deliveries)
        except Exception as exc:  # the intake redelivers after ack_wait anyway
            log.warning("%s: nak of %s failed: %s", self.node, call.key, exc)
        call.release(False)

    def retry_delay_s(self, call: Call) -> float:
        spec = self.registry.get(call.fn) if self.registry is not None else None
        return retry_delay_s(spec.retry_backoff_s if spec is not None else (), self.retry_backoff_s, call.deliveries)

    async def dead_letter(self, call: Call, reason: str) -> None:
        """Keep a poison task for inspection and answer its caller with the cause."""
        log.error("%s: %s dead-lettered: %s", self.node, call.key, reason)
        self.metrics.error("dead_letter")
        held = call.held
        kept = {**((held.headers or {}) if held is not None else {}), H.MSG_ID: f"dead.{call.key}",
                H.DEAD_LETTER_REASON: reason[:300], H.DEAD_LETTER_AT: f"{time.time():.3f}"}
        if held is not None:   # what a redrive needs to store it again (broker/deadletters.py)
            kept[H.DEAD_LETTER_SUBJECT] = held.subject
        for attempt in range(2):
            try:
                await self.js.publish(self.subjects.deadletter(self.node, call.fn), call.payload, headers=kept,
                                      stream=deadletter_stream(self.subjects), timeout=STORE_TIMEOUT_S)
                break
            except Exception as exc:
                if attempt == 0 and await self._remake.remade(exc, deadletter_stream(self.subjects)):
                    continue
                log.error("%s: dead letter of %s not stored: %s", self.node, call.key, exc)
                break
        self.executed(call, 500, b"", f"task dead-lettered: {reason}", 0.0)

    # -- delivery -----------------------------------------------------------------------
    async def _reply(self, call: Call, body: bytes, headers: dict[str, str]) -> None:
        try:
            await self.nc.publish(call.reply, body, headers=headers)
        except Exception as exc:  # the caller cannot be reached any more
            log.warning("%s: answer to %s not sent: %s", self.node, call.key, exc)

    def _store(self, call: Call, subject: str, data: bytes) -> None:
        """Store the answer; its acknowledgement (to the node's inbox) acknowledges the intake message."""
        if self._stopping:
            return self._retry_store(call, subject, data)
        loop = self.loop

        def on_ack(msg: Reply) -> None:
            entry = self._acking.pop(token, None)
            if entry is None:   # too late: the retry loop has it
                return
            entry[1].cancel()
            problem = _store_problem(msg)
            if problem is not None:
                log.warning("%s: answer of %s not stored (%s)", self.node, call.key, problem)
                self.metrics.error("answer_not_stored")
                return self._retry_store(call, subject, data)
            self._ack(call)

        def on_timeout() -> None:
            if self._acking.pop(token, None) is not None:
                self.inbox.forget(token)
                self._retry_store(call, subject, data)

        token, reply = self.inbox.expect(on_ack)
        self._acking[token] = (call, loop.call_later(STORE_TIMEOUT_S, on_timeout))
        try:
            self.nc.send(subject, data, reply=reply, headers=header_block(
                f"{H.MSG_ID}: answer.{call.key}\r\n{self._expected_stream}".encode()))
        except Exception as exc:  # not connected: the retry loop waits for the broker
            entry = self._acking.pop(token, None)
            if entry is not None:
                entry[1].cancel()
                self.inbox.forget(token)
                log.warning("%s: answer of %s not stored (%s)", self.node, call.key, exc)
                self._retry_store(call, subject, data)

    def _retry_store(self, call: Call, subject: str, data: bytes) -> None:
        task = asyncio.get_running_loop().create_task(self._store_then_ack(call, subject, data))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    def _ack(self, call: Call) -> None:
        """The answer is stored: the intake message is done with."""
        assert call.held is not None
        try:
            ack_now(call.held)
        except Exception as exc:  # answered and stored: a redelivery finds the answer and stops there
            log.warning("%s: ack of %s failed: %s", self.node, call.key, exc)
        call.release(True)

    async def _store_then_ack(self, call: Call, subject: str, data: bytes) -> None:
        """Retried until stored, the task held meanwhile: running it again would give its caller a
        second, different answer (the message id makes a late double harmless). A stop gives it back."""
        assert call.held is not None
        delay, waiting = 0.5, False
        try:
            while True:
                try:
                    await self.js.publish(subject, data, headers={H.MSG_ID: f"answer.{call.key}"},
                                          stream=self._results_stream, timeout=STORE_TIMEOUT_S)
                    break
                except Exception as exc:  # not stored (yet)
                    self.metrics.error("answer_not_stored")
                    if self._stopping:
                        log.warning("%s: answer of %s not stored (%s); it will be delivered again", self.node, call.key, exc)
                        return call.release(False)
                    if not waiting:
                        waiting = True
                        self.unstored += 1   # /healthz says so meanwhile
                    log.warning("%s: answer of %s not stored (%s); trying again in %.1f s", self.node, call.key, exc, delay)
                    if await self._remake.remade(exc, self._results_stream):
                        continue
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, 15.0)
        finally:
            if waiting:
                self.unstored -= 1
        self._ack(call)

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Wait for answers still being stored (stopping); those not stored by then are given back."""
        self._stopping = True
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._acking and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)   # acknowledgements on their way (a round trip each)
        for token, (call, timer) in list(self._acking.items()):   # no acknowledgement: delivered again
            timer.cancel()
            self.inbox.forget(token)
            del self._acking[token]
            log.warning("%s: answer of %s not acknowledged by JetStream; it will be delivered again", self.node, call.key)
            call.release(False)
        if self._stores:
            _, pending = await asyncio.wait(list(self._stores), timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
            for task in pending:
                task.cancel()

    # -- bookkeeping ----------------------------------------------------------------------
    def _count(self, call: Call, status: int, execution_s: float, total_s: float) -> None:
        self.metrics.result(call.fn, status, execution_s, total_s)
        if self.on_answer is not None:
            self.on_answer(call.key, status, total_s)


def _store_problem(ack: Msg) -> str | None:
    """Why a JetStream ack says the message was not stored; None if it was, now or before (a duplicate)."""
    error = store_error(ack.data, ack.headers or {})
    if error is None:
        return None
    if isinstance(error, NoStreamResponseError):
        return f"no stream answered ({(ack.headers or {}).get(H.NATS_STATUS, '')})"
    return f"JetStream refused it: {error}"


def retry_delay_s(own: Sequence[float], node: Sequence[float], deliveries: int) -> float:
    """The wait before the next delivery: the n-th step of the function's back-off, else the node's."""
    schedule = own or node
    return schedule[max(1, min(deliveries, len(schedule))) - 1]

