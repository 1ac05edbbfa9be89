"""Online adaptation in the simulator: the live learning path (experiences -> learner -> new
weights -> the guard) over consecutive episodes of a workload family, next to the shipped model
frozen on the same episodes (controller/adaptation.py, issue 27).

    .venv/bin/python bench/online_adaptation.py [--kind pg] [--model FILE.npz] [--workloads paper] [--episodes 200]
                                                [--block 20] [--seed 1000] [--learning-rate X]
                                                [--rollout N] [--online '{"update_epochs": 2}']
                                                [--guard '{"trial_periods": 32}']

Prints one line per block of episodes: the mean cost (-return) with online learning and of the
shipped model, their ratio, QoS and mean workers of both, the version deciding at the block's
end, the rollbacks and promotions so far and the share of periods online weights decided. Without the what-if
flags it runs the live defaults (controller/online.py ONLINE_OVERRIDES, ModelGuard's defaults).
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from controller import online
from controller.adaptation import OnlineEpisode, run_online
from controller.training import shipped_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="pg", choices=("pg", "dqn", "sarsa"))
    parser.add_argument("--model", help="the model to start from (default: the shipped one of --kind)")
    parser.add_argument("--workloads", default="paper", help="a family (paper, generated) or a scenario")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--learning-rate", type=float, help="what-if: the online learning rate")
    parser.add_argument("--rollout", type=int, help="what-if: PPO's online rollout (periods)")
    parser.add_argument("--online", default="{}", help="what-if: more online hyper-parameters of the agent (JSON)")
    parser.add_argument("--guard", default="{}", help="what-if: ModelGuard keyword arguments (JSON)")
    args = parser.parse_args()
    overrides = online.ONLINE_OVERRIDES.setdefault(args.kind, {})
    if args.learning_rate is not None:
        overrides["learning_rate"] = args.learning_rate
    if args.rollout is not None:
        overrides["num_steps"] = args.rollout
    overrides.update(json.loads(args.online))
    guard = json.loads(args.guard)
    logging.basicConfig(level=logging.ERROR)   # the guard's rollback lines are counted, not printed
    print(f"{args.kind} on {args.workloads}, episodes {args.seed}..{args.seed + args.episodes - 1}; "
          f"online settings {overrides}; guard {guard or 'defaults'}")
    print(f"{'episodes':>9} {'cost':>6} {'shipped':>7} {'ratio':>5} {'QoS %':>6} {'shipped':>7} "
          f"{'workers':>7} {'shipped':>7} {'version':>12} {'rollbacks':>9} {'promoted':>8} {'online':>6}")
    started = time.perf_counter()
    block: list[OnlineEpisode] = []
    for episode in run_online(args.model or shipped_model(args.kind), args.workloads, args.episodes, args.seed, guard_options=guard):
        block.append(episode)
        if len(block) == args.block or episode.index == args.episodes - 1:
            n = len(block)

            def mean(key: str) -> float:
                return sum(getattr(e, key) for e in block) / n   # noqa: B023

            print(f"{block[0].index:>4}-{episode.index:<4} {mean('online_cost'):6.1f} {mean('shipped_cost'):7.1f} "
                  f"{mean('online_cost') / mean('shipped_cost'):5.2f} {100 * mean('online_qos'):6.2f} "
                  f"{100 * mean('shipped_qos'):7.2f} {mean('online_workers'):7.2f} {mean('shipped_workers'):7.2f} "
                  f"{episode.model_version:>12} {episode.rollbacks:>9} {episode.promotions:>8} {episode.online_periods / episode.periods:6.0%}",
                  flush=True)
            block = []
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
