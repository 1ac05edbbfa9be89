"""Docker worker runtime, measured on a real engine beside the process runtime (the baseline):
cold start of one worker (start -> READY, median), scale-up of 8 at once, and tasks lost when
containers are killed mid-task.

Run: .venv/bin/python bench/docker_runtime.py [--reps 10] [--json OUT]

The engine is DOCKER_HOST's, else a private dockerd (as the tests do; images cached under
~/.cache/p2pfaas). Its own nats-server on a free port; everything is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "_support")]

from docker_engine import cache_dir, docker_engine  # noqa: E402

from broker.client import FaasClient  # noqa: E402
from broker.connection import close_quietly, connect  # noqa: E402
from broker.embedded import NatsServer  # noqa: E402
from broker.messages import NodeConfiguration, SchedulerConfiguration  # noqa: E402
from nodes.node import Node  # noqa: E402
from nodes.runtimes.docker import DockerWorkerRuntime  # noqa: E402
from nodes.settings import NodeSettings  # noqa: E402
from p2pfaas import images  # noqa: E402


def settings(nats_url: str, data_dir: Path, prefix: str, runtime: str, image: str, k: int) -> NodeSettings:
    return NodeSettings(node_id="n1", nats_url=nats_url, prefix=prefix, data_dir=data_dir, runtime=runtime,
                        docker_image=image, learner=False, ack_wait_s=2.0,
                        initial=NodeConfiguration(parallel_running_functions_max=k, queue_length_max=1000),
                        initial_scheduler=SchedulerConfiguration(name="NoScheduler", parameters=["false"]))


async def process_cold_start(env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nodes.worker", env={**os.environ, **env},
                                                stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    assert (await proc.stdout.readline()).strip() == b"READY"
    elapsed = time.perf_counter() - started
    proc.terminate()
    await proc.wait()
    return elapsed


async def container_cold_start(runtime: DockerWorkerRuntime, name: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    worker = await runtime.start(name, env)
    await worker.wait_ready(120)
    elapsed = time.perf_counter() - started
    await worker.stop(10)
    return elapsed


async def scale_up(runtime: DockerWorkerRuntime, env_of, count: int, tag: str) -> float:
    started = time.perf_counter()
    workers = await asyncio.gather(*(runtime.start(f"{tag}-{i}", env_of(f"{tag}-{i}")) for i in range(count)))
    await asyncio.gather(*(w.wait_ready(180) for w in workers))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(w.stop(10) for w in workers))
    return elapsed


async def kill_mid_task(nats_url: str, data_dir: Path, image: str, client, tasks: int, kills: int) -> dict:
    """K=2 docker workers, ``tasks`` sleeps of 0.3 s queued; every worker container is killed
    ``kills`` times while tasks run. Lost = submitted but never answered; duplicates counted."""
    prefix = "benchkill"
    node = await Node(settings(nats_url, data_dir, prefix, "docker", image, 2)).start()
    nc = await connect(nats_url, "bench-kill")
    seen: dict[str, int] = {}
    try:
        await node.pool.wait_ready(120)
        async def count(msg) -> None:
            seen[msg.subject] = seen.get(msg.subject, 0) + 1

        sub = await nc.subscribe(f"{prefix}.result.bench.>", cb=count)
        async with FaasClient(nc, client="bench", prefix=prefix) as faas:
            for i in range(tasks):
                await faas.submit("n1", "sleep", b"0.3", f"k{i}")
            for _ in range(kills):
                await asyncio.sleep(1.0)
                for container in client.containers.list(filters={"label": f"p2pfaas.prefix={prefix}"}):
                    container.kill()
            deadline = time.monotonic() + 180
            while len(seen) < tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(3.0)  # past one ack_wait: a duplicate would show up by now
        await sub.unsubscribe()
    finally:
        await close_quietly(nc)
        await node.stop()
    return {"tasks": tasks, "kills": kills, "answered": len(seen), "lost": tasks - len(seen),
            "duplicates": sum(n - 1 for n in seen.values())}


async def main(reps: int) -> dict:
    with docker_engine() as (client, host), tempfile.TemporaryDirectory() as tmp:
        base = images.import_base_image(client, "p2pfaas-base:bookworm", cache_dir())
        image = images.ensure_image(client, "worker", images.BuildOptions(base=base, ca_bundle=images.pip_ca_bundle()))
        server = await NatsServer(data_dir=Path(tmp) / "nats", port=None).start()
        try:
            prefix = "benchcold"
            node = await Node(settings(server.url, Path(tmp), prefix, "process", image, 1)).start()  # streams + consumer
            try:
                def env_of(name: str) -> dict[str, str]:
                    return {"P2PFAAS_NODE_SETTINGS": node.settings.model_dump_json(),
                            "P2PFAAS_WORKER_NAME": name, "P2PFAAS_WORKER_POOL": "default"}
                runtime = DockerWorkerRuntime(client, image, "n1", "default", prefix=prefix)
                process = [await process_cold_start(env_of(f"p{i}")) for i in range(reps)]
                container = [await container_cold_start(runtime, f"c{i}", env_of(f"c{i}")) for i in range(reps)]
                scale = [await scale_up(runtime, env_of, 8, f"s{r}") for r in range(3)]
            finally:
                await node.stop()
            killed = await kill_mid_task(server.url, Path(tmp) / "kill", image, client, tasks=40, kills=3)
        finally:
            await server.stop()
        info = client.version()
    return {
        "engine": f"Docker {info.get('Version')} ({host})", "worker_image": image, "reps": reps,
        "process_cold_start_median_s": statistics.median(process),
        "container_cold_start_median_s": statistics.median(container),
        "container_vs_process": statistics.median(container) / statistics.median(process),
        "scale_up_8_median_s": statistics.median(scale), "scale_up_8_runs_s": scale,
        "kill_mid_task": killed,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10, help="cold starts per runtime")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    report = asyncio.run(main(args.reps))
    print(f"engine                      {report['engine']}")
    print(f"cold start, process worker  {report['process_cold_start_median_s'] * 1000:7.0f} ms (median of {args.reps})")
    print(f"cold start, container       {report['container_cold_start_median_s'] * 1000:7.0f} ms "
          f"(median of {args.reps}; {report['container_vs_process']:.1f}x the process)")
    print(f"scale-up 0 -> 8 containers  {report['scale_up_8_median_s'] * 1000:7.0f} ms (median of 3)")
    k = report["kill_mid_task"]
    print(f"kill mid-task               {k['tasks']} tasks, every container killed {k['kills']} times: "
          f"{k['answered']} answered, lost {k['lost']}, duplicates {k['duplicates']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
