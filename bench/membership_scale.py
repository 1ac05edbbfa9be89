"""Membership at scale, simulated (no brokers): N nodes publish a heartbeat every period on
``faas.membership.<group>.<node>``; a subject reaches exactly the nodes subscribed to it (NATS
interest), so a node hears only its own group's. Each node keeps the real discovery view
(``nodes.discovery.membership.MembershipView``). Measured per N and group size: heartbeats each
node receives per period, what the hubs relay, the view's CPU per period, and how long a node's
death takes to be noticed (suspected, removed) by its group.

  .venv/bin/python bench/membership_scale.py                      # N = 12, 100, 1,000; flat and groups of 16
  .venv/bin/python bench/membership_scale.py --sizes 1000 --group 32 --json out.json

The emulated deployment (bench/edge.py membership: real nats-servers, N = 3, 6, 12) checks the
model's counts at small N.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.messages import Heartbeat  # noqa: E402
from nodes.discovery.membership import MembershipView, PeerStatus  # noqa: E402

PERIOD_S = 1.0


def simulate(n: int, group: int, periods: int = 30, seed: int = 1) -> dict:
    """``group``: nodes per group (``n``: one group, everyone hears everyone)."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(n)]
    group_of = {name: f"g{i // group}" for i, name in enumerate(names)}
    members: dict[str, list[str]] = {}
    for name in names:
        members.setdefault(group_of[name], []).append(name)
    views = {name: MembershipView(name, PERIOD_S, 3, 10) for name in names}
    received = {name: 0 for name in names}
    victim = rng.choice(names)        # dies in the middle of the run
    dies_at = periods // 3
    suspected_at = removed_at = None
    view_cpu = 0.0
    for period in range(periods):
        now = period * PERIOD_S
        for name in names:
            if name == victim and period >= dies_at:
                continue
            hb = Heartbeat(node=name, group=group_of[name], time=now + rng.random() * 0.01)
            for other in members[group_of[name]]:   # NATS delivers it to its group's subscribers only
                if other != name:
                    received[other] += 1
                    t = time.perf_counter()
                    views[other].observe(hb, now)
                    view_cpu += time.perf_counter() - t
        t = time.perf_counter()
        for view in views.values():
            view.sweep(now)
        view_cpu += time.perf_counter() - t
        if period >= dies_at:
            watchers = [m for m in members[group_of[victim]] if m != victim]
            if watchers:
                statuses = {views[w].status(victim, now + 0.5) for w in watchers}
                if suspected_at is None and statuses <= {PeerStatus.SUSPECTED, PeerStatus.REMOVED}:
                    suspected_at = period - dies_at
                if removed_at is None and statuses == {PeerStatus.REMOVED}:
                    removed_at = period - dies_at
    per_node = sum(received.values()) / n / periods
    relays = sum(len(m) * (len(m) - 1) for m in members.values())   # a hub fans each heartbeat out to its group
    return {"n": n, "group": group, "groups": len(members), "heartbeats_per_node_per_period": round(per_node, 2),
            "hub_relays_per_period": relays, "heartbeat_bytes_per_node_per_period": round(per_node * 330),
            "view_cpu_us_per_node_per_period": round(view_cpu / n / periods * 1e6, 2),
            "suspected_after_periods": suspected_at, "removed_after_periods": removed_at}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sizes", default="12,100,1000")
    parser.add_argument("--group", type=int, default=16, help="nodes per group in the grouped rows")
    parser.add_argument("--periods", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for n in map(int, args.sizes.split(",")):
        for group in (n, min(args.group, n)):
            if rows and rows[-1]["n"] == n and rows[-1]["group"] == group:
                continue
            rows.append(simulate(n, group, args.periods))
    header = ("N", "group", "heartbeats/node/period", "bytes/node/period", "hub relays/period", "view µs/node/period",
              "suspected after", "removed after")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print(f"| {r['n']:,} | {r['group']} | {r['heartbeats_per_node_per_period']} | "
              f"{r['heartbeat_bytes_per_node_per_period']:,} | {r['hub_relays_per_period']:,} | "
              f"{r['view_cpu_us_per_node_per_period']} | {r['suspected_after_periods']} | {r['removed_after_periods']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
