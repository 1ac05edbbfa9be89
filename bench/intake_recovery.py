"""How soon async calls run again after nats-server restarts: seconds from the restart (kill -9,
0.5 s down, started again on the same store) to the first async call's answer, on a node of its
own (in-process workers). The node's intake pulls again as soon as its connection is back
(nodes/intake.py); without that it waited for its lost pull request's expiry plus grace.

    .venv/bin/python bench/intake_recovery.py --runs 5
    PYTHONPATH=/tmp/base .venv/bin/python bench/intake_recovery.py   # older code, for a side-by-side
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer
from broker.messages import NodeConfiguration, SchedulerConfiguration
from nodes.node import Node
from nodes.settings import NodeSettings


async def once(run: int, down_s: float) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="p2pfaas-recovery-"))
    server = NatsServer(data_dir=tmp / "nats", port=None)
    await server.start()
    prefix = f"rec{run}"
    settings = NodeSettings(node_id="n1", nats_url=server.url, prefix=prefix, data_dir=tmp / "node", learner=False,
                            runtime="inprocess",
                            initial=NodeConfiguration(parallel_running_functions_max=2, queue_length_max=8),
                            initial_scheduler=SchedulerConfiguration(name="NoScheduler", parameters=["false"]))
    node = await Node(settings).start()
    nc = None
    try:
        assert node.pool is not None
        await node.pool.wait_ready(30)
        nc = await connect(server.url, "recovery-client")
        async with FaasClient(nc, client="dev1", prefix=prefix) as faas:
            assert (await faas.call_async("n1", "echo", b"before", timeout_s=20)).status == 200
            assert server.proc is not None
            server.proc.kill()
            await asyncio.wait_for(server.proc.wait(), 10)
            await asyncio.sleep(down_s)
            await server.start()
            restarted = time.monotonic()
            deadline = restarted + 30
            while not (node.nc.is_connected and nc.is_connected) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            answer = await faas.call_async("n1", "echo", b"after", req=f"after{run}", timeout_s=30)
            assert answer.status == 200, answer
            return time.monotonic() - restarted
    finally:
        await close_quietly(nc)
        await node.stop()
        await server.stop()


async def main(args: argparse.Namespace) -> None:
    seconds = []
    for run in range(args.runs):
        seconds.append(await once(run, args.down_s))
        print(f"run {run + 1}/{args.runs}: {seconds[-1]:.2f} s", flush=True)
    print(f"restart -> first async answer: median {statistics.median(seconds):.2f} s "
          f"(min {min(seconds):.2f}, max {max(seconds):.2f}, {args.runs} runs)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="seconds from a nats-server restart to the first async answer")
    parser.add_argument("--runs", type=int, default=5, help="restarts, each on a fresh server and node (default 5)")
    parser.add_argument("--down-s", type=float, default=0.5, help="seconds nats-server stays down (default 0.5)")
    asyncio.run(main(parser.parse_args()))
