"""NATS header reading and writing: nats-py's client against p2pfaas's ``NatsClient`` (broker/connection.py),
side by side in one process, on the headers of a direct call's answer (P2PFaaS's ten).

Run from the repository root: ``.venv/bin/python bench/headers.py [--reps 7] [--n 5000]``. Prints the
median µs per message of each over the repetitions (they alternate) and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from nats.aio.client import Client

from broker.answers import answer_headers
from broker.fastpath import NatsClient
from broker.messages import HopTiming


def answer_headers_of_a_direct_call() -> tuple[bytes, dict[str, str], bytes]:
    hop = HopTiming(node="n1", arrival=time.time(), scheduling_s=4e-5, total_s=6e-4)
    headers = answer_headers(status=200, scheduler="NoScheduler(false)", executed_by="n1", hops=[hop],
                             execution_s=1e-6, queueing_s=2e-5, transit_s=3e-4)
    block = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n"
    return b"hello", headers, block


async def measure(reps: int, n: int) -> dict[str, list[float]]:
    body, headers, block = answer_headers_of_a_direct_call()
    clients = {"nats-py": Client(), "NatsClient": NatsClient()}

    async def nowhere(command: bytes, priority: bool = False) -> None:   # the command, not the socket
        return None

    for client in clients.values():
        client._send_command = nowhere   # type: ignore[method-assign]
        client._flush_queue = None
    out: dict[str, list[float]] = {f"{name} {op}": [] for name in clients for op in ("write", "read")}
    for _ in range(reps):
        for name, client in clients.items():
            started = time.perf_counter()
            for _ in range(n):
                await client._send_publish("_INBOX.abc.1", "", body, len(body), headers)
            out[f"{name} write"].append((time.perf_counter() - started) / n * 1e6)
            started = time.perf_counter()
            for _ in range(n):
                type(client)._parse_header_lines(block)
            out[f"{name} read"].append((time.perf_counter() - started) / n * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="alternating repetitions (default 7)")
    parser.add_argument("--n", type=int, default=5000, help="messages per repetition (default 5000)")
    args = parser.parse_args()
    results = asyncio.run(measure(args.reps, args.n))
    _, headers, _ = answer_headers_of_a_direct_call()
    print(f"{len(headers)} headers, median µs per message over {args.reps} repetitions of {args.n}:")
    for op in ("write", "read"):
        theirs, ours = (statistics.median(results[f"{name} {op}"]) for name in ("nats-py", "NatsClient"))
        print(f"  {op:5}  nats-py {theirs:6.1f}  NatsClient {ours:6.1f}  ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
