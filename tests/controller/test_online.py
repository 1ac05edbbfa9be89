"""ModelGuard: when the learner's online weights decide, and the rollback to the shipped model (pure)."""

from __future__ import annotations

import pytest

from controller.baselines import RLPolicy
from controller.online import SHIPPED, ModelGuard

from .conftest import make_scenario, telemetry

SC = make_scenario()


class Agent:
    n_actions = 3

    def __init__(self, action: int) -> None:
        self.action = action

    def act(self, obs, explore=False):
        return self.action


def period(met: int, completed: int = 10):
    return telemetry(completed=completed, met_deadline=met, qos=met / completed)


def test_online_weights_decide_once_the_shipped_qos_is_known_then_newer_ones_follow():
    shipped, online, newer = Agent(1), Agent(2), Agent(0)
    policy = RLPolicy("dqn", shipped, SC)
    guard = ModelGuard(policy, reference_periods=3, trial_periods=3, min_tasks=10)
    guard.floor_version = 5
    guard.offer(online, 5)                # the seeded version itself: not a candidate
    assert guard.candidate is None
    guard.offer(online, 9)
    for _ in range(2):
        assert not guard.observe(period(10))
    assert policy.agent is shipped and policy.version == SHIPPED
    guard.observe(period(10))             # third shipped period: the reference is known
    assert policy.agent is online and policy.version == guard.version == "online-9"
    guard.offer(newer, 12)
    assert policy.agent is newer and policy.version == "online-12"


def test_worse_online_weights_are_rolled_back_and_never_used_again():
    shipped, online = Agent(1), Agent(2)
    policy = RLPolicy("dqn", shipped, SC)
    guard = ModelGuard(policy, reference_periods=3, trial_periods=2, min_tasks=10, tolerance=0.005)
    guard.offer(online, 3)
    for _ in range(3):
        guard.observe(period(10))         # shipped: 100 % (3 periods: a stratum is judged from then on)
    assert policy.version == "online-3"
    assert not guard.observe(period(9))   # one period judged is not enough
    assert guard.observe(period(9))       # 90 % over two periods < 100 %: roll back
    assert policy.agent is shipped and policy.version == SHIPPED and guard.rollbacks == 1
    guard.offer(online, 4)                # trained before the learner was reset: refused
    assert guard.candidate is None and guard.awaiting_reseed
    guard.reseeded(6)                     # the learner restarts from the shipped weights at version 6
    guard.offer(online, 6)
    assert guard.candidate is None
    guard.offer(online, 7)
    assert guard.candidate == (online, 7) and policy.version == "online-7"


def test_online_weights_that_do_as_well_keep_deciding():
    policy = RLPolicy("dqn", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=1, trial_periods=2, min_tasks=10)
    guard.observe(period(9))              # shipped: 90 %
    guard.offer(Agent(2), 7)
    guard.observe(period(9))
    for _ in range(5):
        assert not guard.observe(period(9))   # 90 % is not below 90 %
    assert policy.version == "online-7" and guard.rollbacks == 0


def test_a_version_that_turns_bad_after_a_long_good_run_is_rolled_back_as_fast_as_on_its_first_day():
    """The trial was the online weights' whole life: after 1,000 good periods (2 h 13 min at 8 s),
    a new version meeting 80 % of deadlines against the shipped 99 % decided for 80 more periods
    (~11 min at 8 s; ~2 h after a day) before the rollback. Now the recent periods are judged."""
    shipped, good, bad = Agent(1), Agent(2), Agent(0)
    policy = RLPolicy("dqn", shipped, SC)
    guard = ModelGuard(policy, reference_periods=3, trial_periods=4, min_tasks=100)
    guard.offer(good, 3)
    for _ in range(3):
        guard.observe(period(99, 100))        # shipped: 99 %
    assert policy.version == "online-3"
    for _ in range(1000):
        assert not guard.observe(period(100, 100))
    guard.offer(bad, 4)                       # same lineage: decides at once
    rolled_back = [guard.observe(period(80, 100)) for _ in range(4)]
    # back to the good weights: 100 % against the shipped 99 % over 1,000 periods promoted them
    assert any(rolled_back) and policy.agent is good and guard.promotions >= 1 and guard.rollbacks == 1, rolled_back


def test_a_quiet_pool_is_judged_over_as_many_recent_periods_as_hold_min_tasks():
    policy = RLPolicy("dqn", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=3, trial_periods=2, min_tasks=10)
    for _ in range(3):
        guard.observe(period(10))             # shipped: 100 %
    guard.offer(Agent(2), 7)
    for _ in range(4):                        # 2 tasks a period: 5 periods hold 10 tasks
        assert not guard.observe(period(1, 2))
    assert guard.observe(period(1, 2))        # 50 % over the 5 periods that hold 10 tasks


def test_online_weights_are_judged_against_the_shipped_qos_in_periods_of_the_same_load():
    """A surge misses deadlines whoever decides: the online weights meeting in a surge what the
    shipped model met in its surges are not rolled back; doing worse in steady periods they are."""
    def at(rate: float, met: int, completed: int = 100):
        return telemetry(arrival_rate=rate, completed=completed, met_deadline=met, qos=met / completed)

    policy = RLPolicy("dqn", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=4, min_tasks=100, tolerance=0.005)
    guard.offer(Agent(2), 7)
    for rate, met in [(2, 100)] * 4 + [(10, 60), (10, 70), (10, 80)] + [(10, 100)]:
        guard.observe(at(rate, met))      # shipped: 100 % steady, 70 % in its surge and after it
    assert policy.version == "online-7"
    assert guard.expected_qos(0) == 1.0 and guard.expected_qos(2) == pytest.approx(0.7)
    for _ in range(4):                    # quiet again, then the same surge under the online weights
        assert not guard.observe(at(2, 100))
    for met in (60, 70, 80):
        assert not guard.observe(at(10, met)), "a surge like the shipped model's is no reason to roll back"
    assert guard.rollbacks == 0
    for _ in range(4):                    # steady periods at 90 %: the shipped model met 100 % there
        if guard.observe(at(10, 90)):
            break
    assert guard.rollbacks == 1 and policy.version == SHIPPED


def test_a_drop_that_chance_explains_is_no_reason_to_roll_back():
    """Tasks of one period miss together: the margin is the spread of the shipped model's own
    period QoS, over the periods judged."""
    policy = RLPolicy("dqn", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=4, trial_periods=4, min_tasks=100, tolerance=0.005)
    for met in (100, 90, 100, 90):
        guard.observe(period(met, 100))   # shipped: 95 %, periods 5 points either side
    assert guard.expected_qos(0) == pytest.approx(0.95) and guard.spread(0) == pytest.approx(0.0025)
    guard.offer(Agent(2), 7)
    for _ in range(4):                    # 91 % over 4 periods: within chance (2.33 x 5 / sqrt(4) = 5.8 points)
        assert not guard.observe(period(91, 100))
    for _ in range(60):                   # 91 % for longer: 4 points below is more than chance over 32+ periods
        if guard.observe(period(91, 100)):
            break
    assert guard.rollbacks == 0           # the newest 4 periods are judged: 5.8 points allowed
    guard.trial_periods = 36              # judged over 36 periods: 1.9 points allowed
    assert guard.observe(period(91, 100)) and guard.rollbacks == 1


def test_periods_of_a_load_the_shipped_model_has_not_seen_are_not_judged():
    def at(rate: float, met: int):
        return telemetry(arrival_rate=rate, completed=100, met_deadline=met, qos=met / 100)

    policy = RLPolicy("dqn", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=4, trial_periods=2, min_tasks=100)
    for _ in range(4):
        guard.observe(at(2, 100))         # shipped: steady periods only
    guard.offer(Agent(2), 7)
    for met in (40, 50, 60):              # a surge: nothing to compare it with
        assert not guard.observe(at(10, met))
    assert guard.observe(at(10, 80)) or guard.observe(at(10, 80))   # steady again, and worse than shipped


def test_online_weights_proven_better_are_promoted_and_a_relapse_comes_back_to_them():
    """A PPO lineage that met 99 % where the shipped model met 95 % went back to 94.5 % 60
    episodes later: judged against the shipped model only, the relapse was never rolled back."""
    shipped, good, relapsed = Agent(1), Agent(2), Agent(0)
    policy = RLPolicy("pg", shipped, SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=8, min_tasks=100, promote_periods=16)
    for i in range(8):
        guard.observe(period(95 + 3 * (-1) ** i, 100))   # shipped: 95 % +- 3 points a period
    guard.offer(good, 5)
    assert policy.version == "online-5"
    for i in range(15):
        assert not guard.observe(period(99 + i % 2, 100))
    assert guard.promotions == 0             # not yet over promote_periods
    assert not guard.observe(period(99, 100))
    assert guard.promotions == 1 and guard.anchor is good and guard.anchor_version == 5
    assert policy.agent is good and policy.version == "online-5"   # they go on deciding
    assert guard.expected_qos(0) == pytest.approx(1591 / 1600)     # ... judged against their own QoS
    guard.offer(relapsed, 9)                 # same lineage, back at the shipped model's QoS
    assert any(guard.observe(period(95, 100)) for _ in range(8))
    assert policy.agent is good and policy.version == "online-5" and guard.rollbacks == 1
    assert guard.awaiting_reseed             # the learner restarts from the promoted weights
    guard.reseeded(12)
    guard.offer(Agent(1), 13)
    assert policy.version == "online-13"     # the promoted weights' reference is known: at once


def test_online_weights_no_better_than_chance_are_not_promoted():
    policy = RLPolicy("pg", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=8, min_tasks=100, promote_periods=16)
    for i in range(8):
        guard.observe(period(95 + 5 * (-1) ** i, 100))   # shipped: 95 % +- 5 points
    guard.offer(Agent(2), 5)
    for i in range(40):   # 96.5 %: 1.5 points up, within chance over 16 periods (2.1 points at 95 %)
        assert not guard.observe(period(96 + i % 2, 100))
    assert guard.promotions == 0 and guard.rollbacks == 0 and guard.anchor_version is None


def test_a_small_lasting_drop_is_caught_over_the_longer_window():
    policy = RLPolicy("pg", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=32, min_tasks=100, promote_periods=96)
    for i in range(8):
        guard.observe(period(95 + 5 * (-1) ** i, 100))   # shipped: 95 % +- 5 points a period
    guard.offer(Agent(2), 5)
    # 93.5 %: within chance over 32 periods (2.33 x 5 / sqrt(32) = 2.1 points), not over 96 (1.2)
    rolled_back = [guard.observe(period(93 + i % 2, 100)) for i in range(96)]
    assert rolled_back.index(True) == 95 and guard.rollbacks == 1


def decided(guard: ModelGuard, t, current: int = 8) -> bool:
    """One period as the controller runs it: judge, decide, then what the anchor would have asked for."""
    rolled_back = guard.observe(t)
    guard.shadow(current, guard.policy.decide(t, current))
    return rolled_back


def test_online_weights_asking_fewer_workers_in_the_same_states_for_the_same_qos_are_promoted():
    """Paired with the anchor's decision in the same state, so the hour's load cancels out."""
    shipped, leaner = Agent(1), Agent(0)          # keep the target; one worker fewer
    policy = RLPolicy("pg", shipped, SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=8, min_tasks=100, promote_periods=16, judge_cost=True)
    for _ in range(8):
        decided(guard, period(100, 100))
    guard.offer(leaner, 5)
    assert [decided(guard, period(100, 100)) for _ in range(16)] == [False] * 16
    assert guard.promotions == 0                  # 15 judged decisions so far: not yet
    assert not decided(guard, period(100, 100))
    assert guard.promotions == 1 and guard.anchor is leaner and guard.rollbacks == 0
    # promoted on cost, not on QoS: the QoS reference keeps the shipped model's periods (of other
    # hours too) and adds theirs, rather than standing on their 16 periods alone
    assert guard.reference.total_periods == 8 + 17


def test_online_weights_asking_more_workers_for_no_better_qos_are_rolled_back():
    shipped, richer = Agent(1), Agent(2)          # keep; one worker more
    policy = RLPolicy("pg", shipped, SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=8, min_tasks=100, promote_periods=16, judge_cost=True)
    for _ in range(8):
        decided(guard, period(100, 100))
    guard.offer(richer, 5)
    rolled_back = [decided(guard, period(100, 100)) for _ in range(20)]
    assert rolled_back.index(True) == 16 and guard.rollbacks == 1 and policy.agent is shipped
    assert guard.promotions == 0
    # by default cost is not judged: those workers may be what meets a later surge's deadlines
    guard = ModelGuard(RLPolicy("pg", shipped, SC), reference_periods=8, trial_periods=8, min_tasks=100,
                       promote_periods=16)
    for _ in range(8):
        decided(guard, period(100, 100))
    guard.offer(richer, 5)
    assert not any(decided(guard, period(100, 100)) for _ in range(40)) and not guard.extra


def test_online_weights_deciding_as_the_anchor_does_are_never_judged_on_cost():
    policy = RLPolicy("pg", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=8, min_tasks=100, promote_periods=16, judge_cost=True)
    for i in range(8):
        decided(guard, period(95 + 3 * (-1) ** i, 100))
    guard.offer(Agent(1), 5)
    assert not any(decided(guard, period(95 + 3 * (-1) ** i, 100)) for i in range(200))
    assert guard.promotions == 0 and guard.rollbacks == 0


def test_fewer_workers_are_not_promoted_when_the_missed_work_costs_more_than_they_save():
    """Priced as the env prices a miss (miss_cost x its work): 1 point of QoS on 100 tasks of 2 s
    per 8 s period is 60 x 25 x 0.01 = 15 workers, far more than the one saved."""
    policy = RLPolicy("pg", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=8, min_tasks=100, promote_periods=16, judge_cost=True,
                       tolerance=0.02)            # a 1-point drop is within QoS's tolerance here
    for _ in range(8):
        decided(guard, period(100, 100))
    guard.offer(Agent(0), 5)
    rolled_back = [decided(guard, period(99, 100)) for _ in range(20)]
    assert guard.promotions == 0 and rolled_back.index(True) == 16   # dearer: rolled back on cost


def test_a_gain_smaller_than_the_cost_tolerance_is_no_reason_to_promote_or_roll_back():
    """Sure but small: a tenth of a worker per period out of 8 is under 2 % of the anchor's."""
    policy = RLPolicy("pg", Agent(1), SC)
    guard = ModelGuard(policy, reference_periods=8, trial_periods=8, min_tasks=100, promote_periods=16, judge_cost=True)
    for _ in range(8):
        decided(guard, period(100, 100))
    guard.offer(Agent(1), 5)
    for i in range(60):
        policy.agent = Agent(0 if i % 10 == 0 else 1)   # one worker fewer one period in ten
        assert not decided(guard, period(100, 100))
    assert guard.promotions == 0 and guard.rollbacks == 0


def test_judging_cost_over_fewer_periods_than_two_batches_is_refused_when_built():
    with pytest.raises(ValueError, match="promote_periods >= 16"):
        ModelGuard(RLPolicy("pg", Agent(1), SC), promote_periods=8, judge_cost=True)
    ModelGuard(RLPolicy("pg", Agent(1), SC), promote_periods=8)   # cost not judged: nothing to refuse
