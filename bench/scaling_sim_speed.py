"""How fast the farm simulator and the scaling env run (offline training throughput).

    .venv/bin/python bench/scaling_sim_speed.py [--scenario bursty] [--episodes 50]

Prints the time of one simulated episode (target: a 4-minute scenario well under 1 s)
and env steps per second with random actions.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from controller.env import FarmScalingEnv
from controller.scenario import load_scenario
from controller.simulator import FarmSimulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="bursty")
    parser.add_argument("--episodes", type=int, default=50)
    args = parser.parse_args()
    sc = load_scenario(args.scenario)
    rng = np.random.default_rng(0)

    durations, tasks = [], 0
    for seed in range(args.episodes):
        started = time.perf_counter()
        sim = FarmSimulator(sc, seed)
        sim.advance(sc.step_seconds)
        for _ in range(sc.steps):
            sim.set_target(int(rng.integers(sc.workers.min, sc.workers.max + 1)))
            sim.advance(sc.step_seconds)
        tasks += sim.totals().tasks
        durations.append(time.perf_counter() - started)
    per_episode = np.array(durations)
    print(
        f"simulator: {sc.name}, {sc.episode_seconds:g} s simulated per episode, {tasks / args.episodes:.0f} tasks: "
        f"median {1e3 * np.median(per_episode):.1f} ms, max {1e3 * per_episode.max():.1f} ms per episode "
        f"({sc.episode_seconds / np.median(per_episode):,.0f}x real time)"
    )

    env = FarmScalingEnv(sc)
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < 2.0:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated or truncated:
            env.reset()
    print(f"env: {steps / (time.perf_counter() - started):,.0f} steps/s with random actions")


if __name__ == "__main__":
    main()
