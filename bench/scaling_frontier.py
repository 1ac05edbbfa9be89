"""What simple causal scaling rules can reach on each scenario, next to the hindsight references.

    .venv/bin/python bench/scaling_frontier.py [--episodes 10] [--scenarios bursty,...,generated,paper]
                                               [--initial-fits]

For every scenario: the QoS ceiling (the largest pool from the first decision on), the smallest
fixed pool reaching 99 % and the instant-resize oracle (both chosen with hindsight), the lookahead
oracle (a perfect forecast of the arrival rate, but real cold starts: the best any policy can do),
then a grid of causal rules (each target action of controller/features.py applied every period,
and square-root staffing with hysteresis) and the cheapest rule that reaches 99 %. It shows which
autoscaling targets a policy that cannot see the future can meet at all, and which no policy can
(docs/autoscaling.md). With ``--initial-fits`` every shipped scenario starts with a pool that fits
the load of its warm-up period (:func:`fitted`).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from controller.evaluation import evaluate
from controller.frontier import rules
from controller.scenario import Scenario, load_scenario
from controller.workloads import FAMILIES

QOS_TARGET = 99.0


def fitted(scenario: Scenario) -> Scenario:
    """``scenario`` with an initial pool at least the square-root staffing of the load of its
    warm-up period (its highest arrival rate then x the mean service time): the tasks that come
    before the first decision no longer meet a pool too small for them."""
    rate = float(np.max(scenario.phases[0].rate_at(np.linspace(0.0, scenario.step_seconds, 64))))
    load = rate * scenario.mean_service_s
    initial = min(scenario.workers.max, max(scenario.workers.initial, math.ceil(load + math.sqrt(load))))
    return scenario.model_copy(update={"workers": scenario.workers.model_copy(update={"initial": initial})})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--scenarios", default="bursty,steady,spike,diurnal,generated,paper")
    parser.add_argument("--initial-fits", action="store_true",
                        help="start every shipped scenario with a pool that fits its warm-up load")
    args = parser.parse_args()
    for name in args.scenarios.split(","):
        scenario = fitted(load_scenario(name)) if args.initial_fits and name not in FAMILIES else name
        report = evaluate(scenario, rules(), episodes=args.episodes, seed=0, references=True)
        policies = report.policies
        oracle = next(p for p in policies if p.name.startswith("oracle"))
        oracle_workers = oracle.metrics["mean_workers"].mean
        initial = "" if isinstance(scenario, str) else f", initial pool {scenario.workers.initial}"
        print(f"\n{name} ({args.episodes} episodes{initial})")
        print(f"{'policy':52} {'QoS %':>7} {'workers':>8} {'/oracle':>8} {'worker-s':>9} {'actions':>8}")
        for p in policies:
            m = p.metrics
            print(f"{p.name:52} {m['qos_pct'].mean:7.2f} {m['mean_workers'].mean:8.2f} "
                  f"{m['mean_workers'].mean / oracle_workers:8.2f} {m['worker_seconds'].mean:9.0f} "
                  f"{m['scaling_actions'].mean:8.1f}")
        passing = [p for p in policies if p.role == "rule" and p.metrics["qos_pct"].mean >= QOS_TARGET]
        if passing:
            best = min(passing, key=lambda p: p.metrics["mean_workers"].mean)
            print(f"cheapest causal rule at >= {QOS_TARGET:g} %: {best.name}, "
                  f"{best.metrics['mean_workers'].mean / oracle_workers:.2f}x the oracle's workers")
        else:
            print(f"no causal rule here reaches {QOS_TARGET:g} %")


if __name__ == "__main__":
    main()
