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

            def state() -> str:   # what a stage that does not end within its bound was waiting for
                d = farm.dispatcher
                done = sum(c.done() for c in calls)
                return (f"calls answered {done}/30; farm workers {[(w.name, w.state) for w in farm.workers]}, target "
                        f"{farm.target}; dispatcher running {d.n_running}, queued {d.n_queued}; controller targets "
                        f"{[h.target for h in ctl.history]}")

            # every stage bounded, together within the test's 120 s, and a stall says where it is
            calls = [asyncio.create_task(faas.invoke("n1", "sleep", b"0.3", timeout_s=40)) for _ in range(30)]
            try:
                await wait_until(lambda: farm.ready >= 3, timeout_s=25)          # the burst scaled the pool out
                answers = await asyncio.wait_for(asyncio.gather(*calls), 40)
            except (AssertionError, asyncio.TimeoutError) as exc:
                raise AssertionError(f"burst: {type(exc).__name__} {exc}; {state()}") from None
            peak = max(step.target for step in ctl.history)
            try:
                await wait_until(lambda: farm.target == 1 and len(farm.workers) == 1, timeout_s=25)  # idle: back in
            except AssertionError as exc:
                raise AssertionError(f"idle: {exc}; {state()}") from None
            completed = lambda: sum(decode(PoolTelemetry, m.data).completed for m in telemetry.messages)  # noqa: E731
            await wait_until(lambda: completed() == 30, timeout_s=10)  # the last period is sampled too
    assert all(a.status == 200 for a in answers)                           # nothing lost
    assert peak >= 3
    samples = [decode(PoolTelemetry, m.data) for m in telemetry.messages]
    assert sum(t.completed for t in samples) == 30 and sum(t.arrivals for t in samples) == 30
    assert max(t.queue_length for t in samples) > 0 and all(t.pool == "farm" for t in samples)
