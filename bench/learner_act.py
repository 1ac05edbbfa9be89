"""Latency of the learner's two acting paths: `RemotePolicy` (act over NATS request/reply) and
`LocalPolicy` (a weights copy, no round trip); median/p99 for the scheduling model (dsarsa) and
a pool's scaling model (dqn), next to a raw NATS request/reply echo as the floor.

Run: .venv/bin/python bench/learner_act.py [--remote-calls 2000] [--local-calls 20000] [--json]
The learner runs in this process, on its own NATS connection, against a private nats-server
(or --nats-url).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from broker.codec import encode
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer
from broker.messages import ScalingExperience, SchedulingExperience
from broker.subjects import Subjects, scaling_model
from nodes.learner.client import LocalPolicy, RemotePolicy
from nodes.learner.service import LearnerService
from nodes.learner.settings import LearnerSettings

OBS_DIM = 9   # the farm env's telemetry vector


def summary(samples_ns: list[int]) -> dict[str, float]:
    samples_ns = sorted(samples_ns)
    return {"median_us": statistics.median(samples_ns) / 1e3, "p99_us": samples_ns[int(0.99 * (len(samples_ns) - 1))] / 1e3}


async def timed_async(call, states, calls: int) -> dict[str, float]:
    for state in states[:200]:  # warm-up
        await call(state)
    samples = []
    for i in range(calls):
        start = time.perf_counter_ns()
        await call(states[i % len(states)])
        samples.append(time.perf_counter_ns() - start)
    return summary(samples)


def timed_sync(call, states, calls: int) -> dict[str, float]:
    for state in states[:1000]:
        call(state)
    samples = []
    for i in range(calls):
        start = time.perf_counter_ns()
        call(states[i % len(states)])
        samples.append(time.perf_counter_ns() - start)
    return summary(samples)


async def train(client_nc, learner: LearnerService, prefix: str, rng: np.random.Generator) -> None:
    """Populate both models: 2000 scheduling samples (P2PFaaS-like state: task type, running, queued)
    and 300 scaling transitions, through the durable stream like any experience."""
    js, s = client_nc.jetstream(), Subjects(prefix)
    for eid in range(2000):
        state = [float(rng.integers(2)), float(rng.integers(4)), float(rng.integers(3))]
        await js.publish(s.reward("n1"), encode(SchedulingExperience(eid=eid, state=state, action=int(rng.integers(2)),
                                                                     reward=float(rng.random()))))
    for _ in range(300):
        obs = rng.random(OBS_DIM).tolist()
        await js.publish(s.experience("n1", "fib"), encode(ScalingExperience(
            node="n1", pool="fib", observation=obs, action=int(rng.integers(3)), reward=float(rng.random()),
            next_observation=rng.random(OBS_DIM).tolist())))
    node = learner["n1"]
    deadline = time.monotonic() + 120
    while node.stream_seq < 2300:
        if time.monotonic() > deadline:
            raise RuntimeError("the learner did not consume the training experiences in 120 s")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> dict:
    server = None
    nats_url = args.nats_url
    with tempfile.TemporaryDirectory() as tmp:
        if nats_url is None:
            server = await NatsServer(data_dir=Path(tmp) / "nats", port=None).start()
            nats_url = server.url
        learner_nc, client_nc = await connect(nats_url, "bench-learner"), await connect(nats_url, "bench-client")
        prefix = f"bench{int(time.time())}"  # fresh streams even against a shared NATS
        settings = LearnerSettings(node_ids=["n1"], nats_url=nats_url, prefix=prefix, data_dir=Path(tmp),
                                   scaling_parameters={"learning_starts": 64}, pools=["fib"])
        rng = np.random.default_rng(0)
        results: dict = {}
        try:
            async with LearnerService(learner_nc, settings) as learner:
                await train(client_nc, learner, prefix, rng)

                async def echo(msg) -> None:
                    await learner_nc.publish(msg.reply, msg.data)
                sub = await learner_nc.subscribe(f"{prefix}.echo", cb=echo)
                await learner_nc.flush()
                results["raw NATS request/reply (floor)"] = await timed_async(
                    lambda _: client_nc.request(f"{prefix}.echo", b"x" * 48, timeout=2), [None], args.remote_calls)
                await sub.unsubscribe()
                cases = {"scheduling (dsarsa)": ("scheduling", 3), "scaling-fib (dqn)": (scaling_model("fib"), OBS_DIM)}
                for label, (model, dim) in cases.items():
                    states = [s.tolist() for s in rng.integers(0, 4, size=(1000, dim)).astype(float)] if dim == 3 \
                        else [s.tolist() for s in rng.random((1000, dim))]
                    remote = RemotePolicy(client_nc, "n1", model, prefix=prefix)
                    results[f"{label} remote"] = await timed_async(lambda st: remote.act(st, explore=False), states,
                                                                   args.remote_calls)
                    async with LocalPolicy(client_nc, "n1", model, prefix=prefix) as local:
                        results[f"{label} local"] = timed_sync(lambda st: local.act(st), states, args.local_calls)
                        agent = local.agent
                        results[f"{label} model only"] = timed_sync(lambda st: agent.act(st), states, args.local_calls)
        finally:
            await close_quietly(client_nc)
            await close_quietly(learner_nc)
            if server:
                await server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote-calls", type=int, default=2000, help="sequential act requests per model")
    parser.add_argument("--local-calls", type=int, default=20_000, help="local act() calls per model")
    parser.add_argument("--nats-url", default=None, help="use this NATS instead of a private nats-server")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = asyncio.run(run(args))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"learner act latency: {args.remote_calls} sequential remote calls, {args.local_calls} local calls")
    print(f"{'path':40} {'median':>10} {'p99':>10}   (microseconds)")
    for name, r in results.items():
        print(f"{name:40} {r['median_us']:10.1f} {r['p99_us']:10.1f}")


if __name__ == "__main__":
    main()
