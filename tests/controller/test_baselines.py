import numpy as np
import pytest

from controller.baselines import (
    BASELINES,
    FixedSize,
    HorizontalPodAutoscaler,
    KedaLag,
    KnativeKPA,
    Reactive,
    RLPolicy,
    ScalingPolicy,
    make_baseline,
)
from controller.features import ObservationBuilder, need_of, staffing

from .conftest import make_scenario, telemetry

SC = make_scenario(step_seconds=8.0, workers={"min": 1, "max": 32, "initial": 12})  # constant 2 s service


def test_every_baseline_is_a_scaling_policy():
    for name in BASELINES:
        policy = make_baseline(name, SC)
        assert isinstance(policy, ScalingPolicy) and policy.name == name
        policy.reset()
        assert isinstance(policy.decide(telemetry(), 10), int)
    with pytest.raises(ValueError, match="unknown baseline"):
        make_baseline("magic", SC)


def test_reactive_farm_model():
    t = telemetry(arrival_rate=5.0, queue_length=8, completed=40, latency_mean_s=3.0, latency_max_s=6.0)
    assert Reactive(SC, on="mean").decide(t, 10) == 15 + 2  # ceil(5 x 3 + 8 x 2 / 8)
    assert Reactive(SC, on="max").decide(t, 10) == 30 + 2
    quiet = telemetry(arrival_rate=1.1, completed=0)
    assert Reactive(SC, on="mean").decide(quiet, 10) == 3  # nothing finished: the service time, ceil(2.2)


def test_reactive_can_estimate_the_service_time():
    policy = Reactive(SC, on="mean", estimate_service=True)
    assert policy.service.value == 2.0  # prior
    for _ in range(30):
        policy.decide(telemetry(in_service=10, throughput=2.5, completed=20, latency_mean_s=4.0), 10)
    assert policy.service.value == pytest.approx(4.0, rel=1e-3)  # Little: 10 / 2.5
    policy.reset()
    assert policy.service.value == 2.0


def test_keda_lag_and_stabilisation():
    keda = KedaLag(SC)
    assert keda.decide(telemetry(time=0, queue_length=90, in_service=5), 1) == 10  # ceil(95 / 10)
    assert keda.decide(telemetry(time=100, queue_length=0, in_service=0), 10) == 10  # held 300 s
    assert keda.decide(telemetry(time=250, queue_length=30, in_service=0), 10) == 10
    assert keda.decide(telemetry(time=301, queue_length=30, in_service=0), 10) == 3  # t=0 left the window
    assert keda.decide(telemetry(time=700, queue_length=0, in_service=0), 3) == 1  # activation 0: the minimum


def test_kpa_stable_and_panic():
    kpa = KnativeKPA(SC)
    assert kpa.decide(telemetry(time=0, in_service=7, workers_ready=10), 10) == 10  # ceil(7 / 0.7)
    assert kpa.panic_since is None
    # 14 in flight on 5 ready: panic wants 20 = 4x ready
    assert kpa.decide(telemetry(time=8, in_service=5, queue_length=9, workers_ready=5), 10) == 20
    assert kpa.panic_since == 8
    # in panic it never scales down, even when the load vanishes
    assert kpa.decide(telemetry(time=16, in_service=1, workers_ready=20), 20) == 20
    # a stable window after the last panic signal it leaves panic; scale down at most halves
    t = telemetry(time=69, in_service=0, workers_ready=20)
    assert kpa.decide(t, 20) == 10 and kpa.panic_since is None


def test_hpa_utilisation_tolerance_and_stabilisation():
    hpa = HorizontalPodAutoscaler(SC)  # target 80 %
    assert hpa.decide(telemetry(time=0, in_service=10), 10) == 13  # ceil(10 x 1.0 / 0.8)
    assert hpa.decide(telemetry(time=15, in_service=11), 13) == 13  # 84.6 % / 80 %: within 10 %
    assert hpa.decide(telemetry(time=30, in_service=2), 13) == 13  # scale-down held for 300 s
    assert hpa.decide(telemetry(time=330, in_service=2), 13) == 3  # ceil(13 x (2 / 13) / 0.8)


def test_fixed():
    assert FixedSize(SC).decide(telemetry(arrival_rate=100), 3) == 12
    assert FixedSize(SC, workers=20).name == "fixed-20"
    sized = make_baseline("fixed-20", SC)
    assert sized.name == "fixed-20" and sized.decide(telemetry(), 3) == 20
    with pytest.raises(ValueError, match="fixed-<n>"):
        make_baseline("fixed-many", SC)


class ScriptedAgent:
    n_actions = 3

    def __init__(self):
        self.seen = []

    def act(self, obs, explore=False):
        self.seen.append((obs, explore))
        return 2


def test_rl_policy_adapter():
    agent = ScriptedAgent()
    policy = RLPolicy("scripted", agent, SC)
    t = telemetry(queue_length=4, arrival_rate=3.0)
    assert policy.decide(t, 7) == 8
    np.testing.assert_array_equal(agent.seen[0][0], ObservationBuilder(SC)(t))
    assert agent.seen[0][1] is False
    assert policy.last_action == 2 and isinstance(policy, ScalingPolicy)
    with pytest.raises(ValueError, match="3 actions"):
        RLPolicy("scripted", agent, SC, "wide")


def test_rl_policy_with_target_actions_sizes_the_pool_from_the_need():
    agent = ScriptedAgent()
    agent.n_actions = 7
    policy = RLPolicy("scripted", agent, SC, "target")
    t = telemetry(queue_length=4, arrival_rate=3.0)
    assert policy.decide(t, 7) == staffing(need_of(t, SC), 2.0)   # action 2: need + 2 sqrt(need)
