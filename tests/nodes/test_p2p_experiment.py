"""A short seeded ``eval p2p`` on the real system: the measurement agrees with Erlang-B, and
power-of-N choices cut the rejections of local-only scheduling."""

from __future__ import annotations

from p2pfaas.experiments.p2p import P2PExperiment, markdown, run_experiment


async def test_short_p2p_experiment_matches_erlang_b_and_power_of_n_helps(nats_server, prefix, tmp_path):
    exp = P2PExperiment(nodes=3, slots=2, mean_service_s=0.1, hot_load=2.0, cold_load=0.5, duration_s=10.0,
                        seed=1, algorithms=[("NoScheduler", ["true"]), ("PowerOfNScheduler", ["2", "2", "true", "1"])])
    report = await run_experiment(exp, nats_url=nats_server.url, prefix=prefix, data_dir=tmp_path)
    local, power = report.outcomes
    print(markdown(report))
    assert local.errors == 0 and power.errors == 0 and local.requests > 200
    # NoScheduler is the M/M/K/K system of each node: Erlang-B(K, A_i) of the loads this sample
    # offered, within sampling error plus the system's own per-task overhead (it holds a slot a
    # few ms longer than the function runs)
    assert abs(local.rejection_rate - report.realised.local_only) < 0.12
    assert local.forwarded == 0 and power.forwarded > 0
    # power-of-N closes much of the gap towards the pooled bound Erlang-B(nK, sum A_i)
    assert power.rejection_rate < 0.6 * local.rejection_rate
    assert power.rejection_rate > report.realised.pooled - 0.05
