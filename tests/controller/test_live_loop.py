"""The whole live loop on real processes: node pool telemetry -> controller -> scale commands
-> worker processes started/stopped, with a burst and an idle period, nothing lost."""

from __future__ import annotations

import asyncio

from broker.codec import decode
from broker.messages import PoolTelemetry
from broker.subjects import Subjects
from controller.baselines import make_baseline
from controller.live import LiveController
from nodes.settings import PoolSpec
from support import Collector, wait_until

from .conftest import make_scenario


async def test_burst_adds_workers_idle_removes_them_and_no_task_is_lost(node_factory, nc, faas, prefix):
    s = Subjects(prefix)
    scenario = make_scenario(step_seconds=0.5, workers={"min": 1, "max": 5, "initial": 1},
                             service_time={"dist": "constant", "value": 0.3})
    pools = {"farm": PoolSpec(functions=["sleep"], initial=1, min=1, max=5)}
    async with node_factory(k=2, pools=pools, telemetry_period_s=0.5, runtime="process") as node, \
            Collector(nc, s.telemetry("n1", "farm")) as telemetry:
        farm = node.pools["farm"]
        assert farm.target == 1 and node.pool.target == 2
        policy = make_baseline("reactive-avg", scenario)
        async with LiveController(nc, "n1", "farm", policy, scenario, prefix=prefix, policy_name="reactive-avg") as ctl:
            calls = [asyncio.create_task(faas.invoke("n1", "sleep", b"0.3", timeout_s=60)) for _ in range(30)]
            await wait_until(lambda: farm.ready >= 3, timeout_s=30)          # the burst scaled the pool out
            answers = await asyncio.gather(*calls)
            peak = max(step.target for step in ctl.history)
            await wait_until(lambda: farm.target == 1 and len(farm.workers) == 1, timeout_s=30)  # idle: back in
            completed = lambda: sum(decode(PoolTelemetry, m.data).completed for m in telemetry.messages)  # noqa: E731
            await wait_until(lambda: completed() == 30, timeout_s=10)  # the last period is sampled too
    assert all(a.status == 200 for a in answers)                           # nothing lost
    assert peak >= 3
    samples = [decode(PoolTelemetry, m.data) for m in telemetry.messages]
    assert sum(t.completed for t in samples) == 30 and sum(t.arrivals for t in samples) == 30
    assert max(t.queue_length for t in samples) > 0 and all(t.pool == "farm" for t in samples)
