"""A very short seeded ``eval learning`` on the real system: every phase runs, every request is
answered, the learners train from the closed-loop rewards, and the report renders."""

from __future__ import annotations

import orjson

from p2pfaas.experiments.learning import LearningExperiment, markdown, run_experiment


async def test_short_learning_experiment_runs_every_phase(nats_server, prefix, tmp_path):
    exp = LearningExperiment(duration_s=3.0, warmup_s=3.0, power_of_n=[["2", "2", "true", "1"]])
    for node in exp.nodes:
        node.rate /= 4
    phases: set[str] = set()
    report = await run_experiment(exp, nats_url=nats_server.url, prefix=prefix, data_dir=tmp_path,
                                  progress=lambda phase, done, total: phases.add(phase))
    assert [o.algorithm for o in report.outcomes] == [
        "NoScheduler", "PowerOfNScheduler(2, 2, true, 1)", "LearningScheduler(2, 2, true, true)"]
    assert "warm-up: LearningScheduler exploring" in phases and len(phases) == 4
    for o in report.outcomes:
        assert o.requests > 10 and o.errors == 0 and o.met + o.rejected <= o.requests
    assert report.learner["n1"]["experiences"] > 10
    assert report.best_power_of_n() is report.outcomes[1]
    assert "LearningScheduler(2, 2, true, true)" in markdown(report)
    assert orjson.loads(report.to_json())["outcomes"][2]["met_rate"] == report.outcomes[2].met_rate
