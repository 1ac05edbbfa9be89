"""The scheduler service: a call from the ingress is decided by the node's algorithm, then Execute queues
it on a pool's Dispatcher, Forward hands it to the Forwarder, Reject answers it through the Answerer."""

from __future__ import annotations

import asyncio
import logging
import time

from nats.aio.client import Client

from broker import codes
from broker.lifecycle import Tasks
from broker.subjects import Subjects
from nodes.answering import Answerer
from nodes.calls import Call
from nodes.config_store import ConfigStore
from nodes.dispatch import Dispatcher
from nodes.forwarding import Forwarder
from nodes.inbox import Inbox
from nodes.metrics import NodeMetrics
from nodes.peer_source import PeerSource
from nodes.scheduler.algorithms import build_algorithm, decide, forced_algorithm
from nodes.scheduler.base import Decision, Execute, Forward, Reject, SchedulingAlgorithm, complete_now
from nodes.scheduler.forward import run_locally
from nodes.scheduler.view import NodeView
from nodes.settings import NodeSettings, memory_share
from nodes.worker import DEFAULT_POOL

log = logging.getLogger(__name__)

MAX_WAITING = 100_000    # calls a pool keeps in memory whatever the algorithm says (NoScheduler without loss)


class SchedulerService:
    def __init__(self, settings: NodeSettings, nc: Client, store: ConfigStore, metrics: NodeMetrics, answerer: Answerer,
                 inbox: Inbox, pools: dict[str, Dispatcher], view: NodeView, peers: PeerSource | None = None) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.subjects = Subjects(settings.prefix)
        self.store, self.metrics, self.answerer = store, metrics, answerer
        self.pools = pools
        self.main = pools[DEFAULT_POOL]
        self.pool_of = {fn: name for name, spec in settings.pools.items() for fn in spec.functions}
        self.algorithm: SchedulingAlgorithm = build_algorithm(store.scheduler.name, store.scheduler.parameters)
        self._described: tuple[SchedulingAlgorithm | None, str] = (None, "")
        self.forwarder = Forwarder(self.node_id, nc, self.subjects, inbox, answerer, self.run_here, self._count_forward,
                                   peers, settings.timings)
        self.forwarder.on_gone.append(self._sender_gone)
        self.forwards: dict[str, int] = {}   # forwards per peer since the last heartbeat
        self.view = view
        self.learning = view.learning
        self._deciding = Tasks(f"{self.node_id}: a call failed while being decided", log)
        self._carrying = Tasks(f"{self.node_id}: a call failed while being carried out", log)
        self._stopping_at: float | None = None   # loop time the node began to stop
        self.queue_bytes_max = memory_share()   # of the direct calls waiting

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await self.forwarder.start()

    async def stop_deciding(self) -> None:
        """After the ingress stopped: probing decisions are cancelled, decided calls get a moment to go out."""
        self._stopping_at = asyncio.get_running_loop().time()
        self._deciding.cancel()
        await asyncio.gather(*self._deciding, return_exceptions=True)
        if self._carrying:
            await asyncio.wait(list(self._carrying), timeout=5.0)

    async def stop(self) -> None:
        """After the pools stopped: forwarded calls get what is left of the workers' grace to come
        back; calls still waiting are answered (direct) or handed back (async)."""
        grace_s = self.settings.timings.stop_grace_s
        since = asyncio.get_running_loop().time() - (self._stopping_at or asyncio.get_running_loop().time())
        await self.forwarder.stop(grace_s=max(0.0, grace_s - since))
        for pool in self.pools.values():
            for call in pool.drain():
                if call.is_async:
                    await self.answerer.lost(call, f"node {self.node_id} stopped before running it", "node_stopping")
                else:
                    await self.answerer.refused(call, codes.GENERIC, 503, f"node {self.node_id} is stopping", "node_stopping",
                                                retry_after_s=1.0)
        await self.answerer.settle()

    def set_algorithm(self, name: str, parameters: list[str]) -> SchedulingAlgorithm:
        self.algorithm = build_algorithm(name, parameters)  # ValueError leaves the old one in place
        return self.algorithm

    # -- deciding -----------------------------------------------------------------------
    def schedule(self, call: Call) -> None:
        """Decide and carry the decision out (in a task of its own if the algorithm has to wait)."""
        request = call.request
        dedicated = self.pool_of.get(call.fn)
        if dedicated is not None and not request.force_reject:
            # a dedicated (autoscaled) pool queues every task: scaling, not admission, keeps its QoS
            call.scheduler = call.scheduler or f"pool {dedicated}"
            return self._execute(call, Execute(), self.pools[dedicated])
        algorithm = self.algorithm
        forced = forced_algorithm(request)
        # X-P2pfaas-Scheduler names the algorithm that decided: the forced one, as P2PFaaS does
        call.scheduler = call.scheduler or (forced.describe() if forced is not None else self._describe(algorithm))
        if algorithm.instant or forced is not None:
            try:
                decision = complete_now(decide(algorithm, request, self.view))
            except Exception as exc:
                return self._answer_later(self._undecided(call, exc))
            return self.carry_out(call, decision)
        self._deciding.spawn(self._decide_and_carry_out(call, algorithm))   # it probes or asks the learner

    def _describe(self, algorithm: SchedulingAlgorithm) -> str:
        """``algorithm.describe()``, computed once per algorithm installed (it is on every call's path)."""
        if self._described[0] is not algorithm:
            self._described = (algorithm, algorithm.describe())
        return self._described[1]

    async def _decide_and_carry_out(self, call: Call, algorithm: SchedulingAlgorithm) -> None:
        try:
            decision = await decide(algorithm, call.request, self.view)
        except Exception as exc:
            return await self._undecided(call, exc)
        self.carry_out(call, decision)

    async def _undecided(self, call: Call, exc: Exception) -> None:
        """The algorithm raised (a bug, an unreadable learner answer): the call is refused now, "cannot
        schedule" (400, HTTP 500), not held undecided until its caller gives up (an async one for ever)."""
        log.debug("%s: %s raised deciding %s", self.node_id, call.scheduler, call.key, exc_info=exc)
        call.scheduled_at = time.time()
        await self.answerer.refused(call, codes.CANNOT_SCHEDULE, codes.STATUS[codes.CANNOT_SCHEDULE],
                                    f"scheduler {call.scheduler} failed to decide: {type(exc).__name__}: {exc}",
                                    "scheduler_failed", retry_after_s=1.0)

    def carry_out(self, call: Call, decision: Decision) -> None:
        call.scheduled_at = time.time()
        call.probing_s = decision.probing_s
        if self.learning is not None:  # X-P2pfaas-Scheduler-Learning-* go back with the answer
            call.learning = self.learning.decision_for(call.key, call.request, decision)
        if isinstance(decision, Execute):
            return self._execute(call, decision, self.main)
        if isinstance(decision, Forward):
            self.metrics.request(call.fn, "forwarded")
            return self._answer_later(self.forwarder.forward(call, decision.peer))
        assert isinstance(decision, Reject)
        if call.is_async and decision.code == codes.CANNOT_SCHEDULE:
            # accepted async work is never refused because others came first: it waits in the async lane
            return self._execute(call, Execute(probing_s=decision.probing_s), self.main)
        # P2PFaaS: 401 deliberately rejected -> HTTP 503; 400 cannot schedule (overload) -> HTTP 500
        self._answer_later(self.answerer.refused(call, decision.code, codes.STATUS.get(decision.code, 500),
                                                 decision.reason, "rejected", retry_after_s=1.0))

    async def run_here(self, call: Call) -> None:
        """A forward found nobody at the peer: run here after all (with loss)."""
        self.carry_out(call, run_locally(self.view, loss=True, probing_s=call.probing_s))

    async def _sender_gone(self, node: str) -> None:
        """``node`` went away: the calls it forwarded here that still wait in a queue are dropped, not
        run (their answers have nowhere to go, and an async one is delivered again at its origin)."""
        def from_it(call: Call) -> bool:
            return call.request.external and call.request.peers[-1:] == (node,)

        for pool in self.pools.values():
            for call in pool.drop_queued(from_it):
                self.answerer.count_unrun(call)
                await self.answerer.refused(call, codes.GENERIC, 503, f"not run: node {node}, which forwarded it, "
                                                                      "went away", "sender_gone")

    def _execute(self, call: Call, decision: Execute, pool: Dispatcher) -> None:
        if not call.is_async and (pool.n_queued >= MAX_WAITING
                                  or pool.queued_bytes + len(call.payload) > self.queue_bytes_max):
            # whatever the algorithm and queue_length_max say, what waits in memory is bounded
            return self._answer_later(self.answerer.refused(
                call, codes.CANNOT_SCHEDULE, 500, f"{pool.n_queued} calls ({pool.queued_bytes} bytes of input) "
                                                  f"already wait on pool {pool.pool}", "rejected", retry_after_s=1.0))
        call.scheduled_at = call.scheduled_at or time.time()
        self.metrics.request(call.fn, "scheduled")
        stats = self.answerer.stats_of(pool.pool)
        if stats is not None:
            stats.arrived()
        pool.submit(call)

    # -- helpers ------------------------------------------------------------------------
    def _answer_later(self, coro) -> None:
        """What a decision leaves to do (a forward, an answer to publish): the stop waits for it, never
        cancels it (that would leave its call unanswered)."""
        self._carrying.spawn(coro)

    def _count_forward(self, peer: str) -> None:
        self.forwards[peer] = self.forwards.get(peer, 0) + 1
