"""EidWindow: P2PFaaS windows of contiguous EIDs from samples arriving in any order (pure logic)."""

from __future__ import annotations

import logging

from broker.messages import LearnerTrainSample
from nodes.learner.eid_window import EidWindow


def s(eid: int) -> LearnerTrainSample:
    return LearnerTrainSample(eid=eid, state=[float(eid % 3)], action=1, reward=1.0)


def eids(runs) -> list[list[int]]:
    return [[x.eid for x in run] for run in runs]


def test_a_sample_arriving_after_its_successor_is_trained_and_no_link_twice():
    window = EidWindow(2, 100)
    assert not window.add(s(2))
    assert window.add(s(3))
    assert eids(window.take()) == [[2, 3]]
    assert window.add(s(1))              # 2 stayed for its late predecessor
    assert eids(window.take()) == [[1, 2]]   # 2 -> 3 is not trained again
    assert window.add(s(4))
    assert eids(window.take()) == [[3, 4]]


def test_windows_of_five_split_into_runs_around_trained_links():
    window = EidWindow(5, 100)
    for eid in (2, 3, 4, 5):
        assert not window.add(s(eid))
    assert window.add(s(6))
    assert eids(window.take()) == [[2, 3, 4, 5, 6]]
    assert not window.add(s(1))          # one untrained link: not a window yet
    for eid in (7, 8):
        assert not window.add(s(eid))
    assert window.add(s(9))
    assert eids(window.take()) == [[1, 2], [6, 7, 8, 9]]
    assert sorted(window.samples) == [1, 9]  # 1 may still get a predecessor, 9 a successor


def test_only_samples_never_trained_are_reported_when_evicted(caplog):
    window = EidWindow(2, 3)
    window.add(s(10))
    window.add(s(11))
    window.take()                        # 10 stays as an anchor for EID 9, 11 for EID 12
    with caplog.at_level(logging.WARNING, logger="nodes.learner.models"):
        window.add(s(20))
        window.add(s(30))                # over the bound: 10 goes quietly (already trained)
        assert 10 not in window.samples and not caplog.records
        window.add(s(40))                # 11 goes: its successor never came, it is lost
    assert 11 not in window.samples and "EID 11 dropped" in caplog.text


def test_restore_keeps_what_was_trained():
    window = EidWindow(2, 100)
    for eid in (5, 6):
        window.add(s(eid))
    window.take()
    again = EidWindow(2, 100)
    again.restore(window.samples.values(), window.trained, window.fed)
    assert again.add(s(4)) and eids(again.take()) == [[4, 5]]
