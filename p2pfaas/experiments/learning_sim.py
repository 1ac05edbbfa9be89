"""A seeded simulation of ``eval learning``'s nodes, to train the shipped scheduling model
(``p2pfaas train scheduling``) in seconds instead of live minutes: the live LearningScheduler's
workload, state, actions and reward; nodes are loss systems of K slots whose executions last
``1 / speed`` times longer; each node's differential SARSA table learns on consecutive EIDs."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from nodes.learner.algorithms import DifferentialSarsa, DifferentialSarsaConfig
from nodes.scheduler.learning import FIRST_PEER, PROBE_AND_FORWARD, REJECT, encode_room_state
from p2pfaas.experiments.learning import LearningExperiment, poisson_arrivals

LOCAL_OVERHEAD_S = 0.002      # scheduling + queueing of a request run where it arrives
FORWARD_OVERHEAD_S = 0.006    # ... and of one forwarded to a peer (one more hop through the broker)
WINDOW = 5                    # the learner's window of contiguous EIDs


@dataclass
class SimStats:
    requests: int = 0
    met: int = 0
    rejected: int = 0
    forwarded: int = 0

    @property
    def met_rate(self) -> float:
        return self.met / self.requests if self.requests else 0.0


@dataclass
class SimNode:
    node_id: str
    slots: int
    speed: float
    busy: list[float] = field(default_factory=list)   # end times of running executions (a heap)

    def free(self, now: float) -> int:
        while self.busy and self.busy[0] <= now:
            heapq.heappop(self.busy)
        return self.slots - len(self.busy)

    def run(self, now: float, service_s: float, overhead_s: float) -> float:
        """Start an execution; its total time (overhead + execution at this node's speed)."""
        duration = service_s / self.speed
        heapq.heappush(self.busy, now + overhead_s + duration)
        return overhead_s + duration


def learner_agents(exp: LearningExperiment, seed: int) -> dict[str, DifferentialSarsa]:
    """One differential SARSA per node, with the experiment's learner parameters."""
    config = DifferentialSarsaConfig(**{k: v for k, v in exp.learner_parameters.items()
                                        if k in DifferentialSarsaConfig.__dataclass_fields__})
    n_actions = FIRST_PEER + len(exp.nodes) - 1
    return {spec.node_id: DifferentialSarsa(0, n_actions, config, seed + i) for i, spec in enumerate(exp.nodes)}


def simulate(exp: LearningExperiment, duration_s: float, seed: int, agents: dict[str, DifferentialSarsa],
             explore: bool = True, train: bool = True, progress: Callable[[int, int], None] | None = None) -> SimStats:
    """Run ``duration_s`` seconds of the experiment's arrivals with the agents deciding."""
    nodes = [SimNode(spec.node_id, spec.slots, spec.speed) for spec in exp.nodes]
    probe_rng = random.Random(seed)
    windows: dict[str, list[dict]] = {n.node_id: [] for n in nodes}
    eids = {n.node_id: 0 for n in nodes}
    stats = SimStats()
    arrivals = poisson_arrivals(exp, duration_s, seed)
    for i, a in enumerate(arrivals):
        origin = nodes[a.node]
        peers = sorted((n for n in nodes if n is not origin), key=lambda n: n.node_id)
        local_free = origin.free(a.at)
        state = encode_room_state(a.task_type, local_free, [p.free(a.at) for p in peers])
        agent = agents[origin.node_id]
        action = agent.act(state, explore=explore)
        target: SimNode | None = origin
        if action == REJECT:
            target = None
        elif action == PROBE_AND_FORWARD and peers:
            peer = probe_rng.choice(peers)
            if peer.slots - peer.free(a.at) < origin.slots - local_free:
                target = peer
        elif action >= FIRST_PEER and action - FIRST_PEER < len(peers):
            target = peers[action - FIRST_PEER]
        total = None
        if target is not None and target.free(a.at) > 0:
            total = target.run(a.at, a.service_s, LOCAL_OVERHEAD_S if target is origin else FORWARD_OVERHEAD_S)
        reward = float(total is not None and total <= exp.task_types[a.task_type].deadline_s)
        stats.requests += 1
        stats.met += int(reward)
        stats.rejected += total is None
        stats.forwarded += total is not None and target is not origin
        if train:
            window = windows[origin.node_id]
            window.append({"eid": eids[origin.node_id], "state": state, "action": action, "reward": reward})
            eids[origin.node_id] += 1
            if len(window) >= WINDOW:
                agent.train_window(window)
                del window[:-1]  # the last sample heads the next window, as in the learner
        if progress is not None and (i % 1000 == 0 or i == len(arrivals) - 1):
            progress(i + 1, len(arrivals))
    return stats


def train_scheduling_tables(exp: LearningExperiment, duration_s: float, seed: int,
                            progress: Callable[[int, int], None] | None = None) -> dict[str, DifferentialSarsa]:
    """Every node's table, trained online over ``duration_s`` simulated seconds."""
    agents = learner_agents(exp, seed)
    simulate(exp, duration_s, seed, agents, explore=True, train=True, progress=progress)
    return agents


def measure_greedy(exp: LearningExperiment, agents: dict[str, DifferentialSarsa], seed: int) -> SimStats:
    """The greedy tables on ``exp.duration_s`` of other arrivals (``seed``), nothing learned."""
    return simulate(exp, exp.duration_s, seed, agents, explore=False, train=False)
