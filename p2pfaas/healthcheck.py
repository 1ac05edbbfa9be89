"""Container health checks (compose.yaml): ``python -m p2pfaas.healthcheck node ID`` asks the node
over NATS (P2PFAAS_* environment), ``... http URL`` GETs a bridge's /healthz. Exit 0 healthy, 1 not."""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request

from broker import headers as H

TIMEOUT_S = 3.0


async def node_answers(node: str) -> bool:
    """The node answers its info request, and the answer says it is well (broker.control.node_health)."""
    import nats

    from broker.connection import credentials_from_env
    from broker.control import node_health
    from broker.subjects import Subjects

    servers = [os.environ.get("P2PFAAS_NATS_URL", "nats://127.0.0.1:4222"),
               *filter(None, os.environ.get("P2PFAAS_SEEDS", "").split(","))]
    identity = credentials_from_env()   # the servers admit no anonymous client
    options = {"user": identity[0], "password": identity[1]} if identity else {}
    nc = await nats.connect(servers, connect_timeout=TIMEOUT_S, allow_reconnect=False, name=f"healthcheck-{node}",
                            **options)
    try:
        msg = await nc.request(Subjects(os.environ.get("P2PFAAS_PREFIX", "faas")).info(node), b"", timeout=TIMEOUT_S)
    finally:
        await nc.close()
    status = (msg.headers or {}).get(H.STATUS, "200")
    _, problem = node_health(node, int(status) if status.isdigit() else 500, msg.data)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
    return problem is None


def http_healthy(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
        return answer.status == 200


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("node", "http"):
        print("usage: python -m p2pfaas.healthcheck node ID | http URL", file=sys.stderr)
        return 2
    try:
        healthy = asyncio.run(node_answers(argv[1])) if argv[0] == "node" else http_healthy(argv[1])
    except Exception as exc:  # unreachable, timed out, refused: unhealthy, said in one line
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
