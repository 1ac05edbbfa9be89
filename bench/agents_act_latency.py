"""Latency of act() for every agent in AGENTS: median and p99 per call, greedy and exploring.

Run: .venv/bin/python bench/agents_act_latency.py [--obs-dim 14] [--actions 7] [--calls 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from nodes.learner.algorithms import AGENTS


def measure(agent, observations: np.ndarray, explore: bool) -> dict[str, float]:
    for obs in observations[:1000]:  # warm-up: allocator, caches, lazy torch init
        agent.act(obs, explore=explore)
    samples = []
    for obs in observations:
        start = time.perf_counter_ns()
        agent.act(obs, explore=explore)
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return {
        "median_us": statistics.median(samples) / 1e3,
        "p99_us": samples[int(0.99 * (len(samples) - 1))] / 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actions", type=int, default=7, help="number of discrete actions (the target mode's)")
    parser.add_argument("--calls", type=int, default=20_000, help="timed act() calls per agent and mode")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    observations = rng.random((args.calls, args.obs_dim), dtype=np.float32)
    results = {}
    for name, cls in AGENTS.items():
        agent = cls(args.obs_dim, args.actions, seed=0)
        # 2000 updates: tabular agents get a populated table; DQN's epsilon is then ~0.8, so its
        # "explore" column is mostly the cheap random branch.
        for obs, next_obs in zip(observations[:2000], observations[1:2001]):
            agent.update(obs, int(rng.integers(args.actions)), float(rng.random()), next_obs, False)
        results[name] = {"greedy": measure(agent, observations, False), "explore": measure(agent, observations, True)}

    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"act() latency, obs_dim={args.obs_dim}, actions={args.actions}, {args.calls} calls, "
          f"torch threads={args.threads}")
    print(f"{'agent':8} {'greedy p50':>12} {'greedy p99':>12} {'explore p50':>12} {'explore p99':>12}   (microseconds)")
    for name, r in results.items():
        g, e = r["greedy"], r["explore"]
        print(f"{name:8} {g['median_us']:12.1f} {g['p99_us']:12.1f} {e['median_us']:12.1f} {e['p99_us']:12.1f}")


if __name__ == "__main__":
    main()
