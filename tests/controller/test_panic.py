"""The controller's reaction between periods (controller/panic.py): the same rule on the same
pulses in the simulator (training, evaluation) and live (a real nats-server, a real node)."""

from __future__ import annotations

import math

import pytest

from broker.codec import decode, encode
from broker.messages import PoolPulse, ScaleCommand
from broker.subjects import Subjects
from controller.env import SimulatedFarm
from controller.evaluation import run_episode
from controller.live import LiveController
from controller.panic import HEADROOM, THRESHOLD, PanicRule
from support import Collector, wait_until

from .conftest import make_scenario, telemetry

# an idle pool of 1, then 10 tasks/s of 1 s each: 10 busy workers needed at once
BURST = make_scenario(step_seconds=8.0, workers={"min": 1, "max": 24, "initial": 1},
                      service_time={"dist": "constant", "value": 1.0}, deadline={"factor": 3.0},
                      phases=[{"duration_s": 16.0, "rate_per_s": 0.2}, {"duration_s": 64.0, "rate_per_s": 10.0}])


class Keeps:
    name = "keeps"

    def reset(self) -> None:
        pass

    def decide(self, t, current_target: int) -> int:
        return current_target


def pulse(**fields) -> PoolPulse:
    base = dict(node="n1", pool="farm", time=0.0, window_s=2.0, arrivals=0, queue_length=0, workers_ready=1,
                workers_starting=0)
    return PoolPulse(**{**base, **fields})


def test_the_rule_raises_to_the_square_root_staffing_of_the_need_and_never_lowers():
    rule = PanicRule(BURST)
    need = 20 / 2.0 * 1.0 + 8 * 1.0 / 8.0   # 10/s x 1 s, and 8 queued drained in one period
    assert rule.need(pulse(arrivals=20, queue_length=8)) == pytest.approx(need)
    assert rule.react(pulse(arrivals=20, queue_length=8), target=1) == math.ceil(need + HEADROOM * math.sqrt(need))
    assert THRESHOLD * 7 <= need < THRESHOLD * 8
    assert rule.react(pulse(arrivals=20, queue_length=8, workers_ready=8), target=8) is None   # 11 < 1.4 x 8: no panic
    assert rule.react(pulse(arrivals=20, queue_length=8, workers_ready=7), target=7) is not None
    assert PanicRule(BURST, threshold=2.0).react(pulse(arrivals=20, queue_length=8, workers_ready=6), target=6) is None
    assert rule.react(pulse(arrivals=20, queue_length=8), target=20) is None                  # never lower
    assert rule.react(pulse(arrivals=400), target=1) == BURST.workers.max                     # within bounds


def test_in_the_simulator_a_burst_is_met_within_a_tick_not_at_the_next_decision():
    without = run_episode(BURST, Keeps(), seed=3)
    farm = SimulatedFarm(BURST, panic=PanicRule(BURST))
    with_panic = run_episode(BURST, Keeps(), seed=3, backend=farm)
    assert without.totals.max_workers == 1 and without.totals.scaling_actions == 0
    raised = [s for s in with_panic.steps if s.target > 1]
    assert raised and raised[0].time <= 16.0 + 8.0           # the period the burst starts in
    assert with_panic.totals.qos > without.totals.qos + 0.3
    assert with_panic.episode_return > without.episode_return


async def test_live_the_controller_raises_the_target_on_a_pulse_and_says_why(nc, prefix):
    s = Subjects(prefix)
    async with Collector(nc, s.scale("n1", "farm")) as commands:
        async with LiveController(nc, "n1", "farm", Keeps(), BURST, prefix=prefix, policy_name="keeps",
                                  react_between_periods=True) as ctl:
            await nc.publish(s.pulse("n1", "farm"), encode(pulse(arrivals=20)))   # before the first telemetry: ignored
            await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(node="n1", pool="farm", workers_ready=1)))
            await wait_until(lambda: len(commands.messages) == 1)
            await nc.publish(s.pulse("n1", "farm"), encode(pulse(arrivals=2)))    # 1 busy for 1: below 1.4x, no panic
            await nc.publish(s.pulse("n1", "farm"), encode(pulse(arrivals=20)))
            await wait_until(lambda: len(commands.messages) == 2)
            assert ctl.target == math.ceil(10 + HEADROOM * math.sqrt(10)) and ctl.panics == 1
    first, raised = (decode(ScaleCommand, m.data) for m in commands.messages)
    assert (first.target_workers, first.reason) == (1, "kept")
    assert (raised.target_workers, raised.reason) == (17, "panic")


async def test_a_baseline_is_left_to_its_own_rule_unless_told(nc, prefix):
    from controller.baselines import make_baseline

    ctl = LiveController(nc, "n1", "farm", make_baseline("kpa", BURST), BURST, prefix=prefix)
    assert ctl.reacts is False
    assert LiveController(nc, "n1", "farm", Keeps(), BURST, prefix=prefix, react_between_periods=True).reacts


async def test_a_node_pulses_a_slow_pool_and_its_controller_scales_it_before_the_next_decision(node_factory, nc,
                                                                                              faas, prefix):
    """A real node: its 6 s pool sends a pulse every 2 s (arrivals since the last one, the queue,
    the workers); a burst into a pool of 1 is met by the controller's panic rule within a pulse,
    before the policy's next decision."""
    import asyncio

    from nodes.settings import PoolSpec

    s = Subjects(prefix)
    scenario = make_scenario(step_seconds=6.0, workers={"min": 1, "max": 8, "initial": 1},
                             service_time={"dist": "constant", "value": 1.0},
                             phases=[{"duration_s": 600.0, "rate_per_s": 1.0}])
    pools = {"farm": PoolSpec(functions=["sleep"], initial=1, min=1, max=8, period_s=6.0)}
    async with node_factory(k=2, pools=pools) as node, \
            Collector(nc, s.pulse("n1", "farm")) as pulses, Collector(nc, s.scale("n1", "farm")) as commands:
        async with LiveController(nc, "n1", "farm", Keeps(), scenario, prefix=prefix, policy_name="keeps",
                                  react_between_periods=True) as ctl:
            await wait_until(lambda: len(ctl.history) == 1, timeout_s=15)   # adopted the pool at its first period
            calls = [asyncio.create_task(faas.invoke("n1", "sleep", b"1.0", timeout_s=40)) for _ in range(12)]
            await wait_until(lambda: ctl.panics >= 1, timeout_s=6)
            assert len(ctl.history) == 1                                   # before the next decision
            await wait_until(lambda: node.pools["farm"].target > 1, timeout_s=5)
            answers = await asyncio.wait_for(asyncio.gather(*calls), 40)
    assert all(a.status == 200 for a in answers)
    seen = [decode(PoolPulse, m.data) for m in pulses.messages]
    assert seen and all(p.pool == "farm" and 1.5 <= p.window_s <= 3.0 for p in seen)
    assert sum(p.arrivals for p in seen) <= 12 and max(p.arrivals for p in seen) > 0
    assert any(decode(ScaleCommand, m.data).reason == "panic" for m in commands.messages)
