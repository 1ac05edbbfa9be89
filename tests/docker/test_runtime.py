"""The Docker worker runtime on a real engine: start, READY, stop, kill, labels, strays."""

from __future__ import annotations

import asyncio
import signal

import docker
import pytest

from nodes.runtimes.docker import (LABEL_NODE, LABEL_POOL, LABEL_PREFIX, LABEL_ROLE, LABEL_WORKER,
                                   DockerWorkerRuntime, WorkerExited, list_containers)
from nodes.settings import NodeSettings


@pytest.fixture
async def runtime(docker_client, worker_image, nats_server, prefix) -> DockerWorkerRuntime:
    """A runtime for node n1's default pool (a worker only needs NATS: the node calls it)."""
    return DockerWorkerRuntime(docker_client, worker_image, "n1", "default", prefix=prefix)


def worker_env(nats_server, prefix: str, name: str) -> dict[str, str]:
    settings = NodeSettings(node_id="n1", nats_url=nats_server.url, prefix=prefix)
    return {"P2PFAAS_NODE_SETTINGS": settings.model_dump_json(), "P2PFAAS_WORKER_NAME": name,
            "P2PFAAS_WORKER_POOL": "default", "PATH": "/host/only/bin"}


async def test_worker_starts_ready_labelled_and_stops_cleanly(runtime, docker_client, nats_server, prefix):
    worker = await runtime.start("n1-w1", worker_env(nats_server, prefix, "n1-w1"))
    await worker.wait_ready(60)
    container = docker_client.containers.get(worker.id)
    assert container.labels[LABEL_PREFIX] == prefix
    assert (container.labels[LABEL_NODE], container.labels[LABEL_POOL]) == ("n1", "default")
    assert (container.labels[LABEL_WORKER], container.labels[LABEL_ROLE]) == ("n1-w1", "worker")
    assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["P2PFAAS_WORKER_NAME"] == "n1-w1" and env["PATH"] != "/host/only/bin"  # only P2PFAAS_* passed
    assert worker.returncode is None

    assert await worker.stop(grace_s=10) == 0                 # SIGTERM: the worker exits by itself
    assert worker.returncode == 0
    with pytest.raises(docker.errors.NotFound):               # and the container is gone
        docker_client.containers.get(worker.id)


async def test_kill_and_signal_like_a_process(runtime, nats_server, prefix):
    first = await runtime.start("n1-w1", worker_env(nats_server, prefix, "n1-w1"))
    second = await runtime.start("n1-w2", worker_env(nats_server, prefix, "n1-w2"))
    await first.wait_ready(60)
    await second.wait_ready(60)
    first.kill()
    assert await asyncio.wait_for(first.wait(), 30) == 128 + signal.SIGKILL
    second.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(second.wait(), 30) == 0
    assert second.stop_requested and not first.stop_requested


async def test_a_worker_that_cannot_connect_exits_before_ready(runtime, prefix):
    settings = NodeSettings(node_id="n1", nats_url="nats://127.0.0.1:1", prefix=prefix)  # nobody listens
    worker = await runtime.start("n1-w9", {"P2PFAAS_NODE_SETTINGS": settings.model_dump_json()})
    with pytest.raises(WorkerExited) as info:
        await worker.wait_ready(60)
    assert info.value.code not in (0, None)
    assert await asyncio.wait_for(worker.wait(), 30) == info.value.code


async def test_strays_are_adopted_or_removed_and_nobody_elses_touched(docker_client, worker_image, prefix):
    runtime = DockerWorkerRuntime(docker_client, worker_image, "n1", "farm", prefix=prefix)
    sleeper = ["python", "-c", "import time; print('READY', flush=True); time.sleep(600)"]

    def make(name: str, labels: dict[str, str], command=sleeper):
        return docker_client.containers.run(worker_image, entrypoint=command, name=f"{prefix}-{name}",
                                            labels=labels, detach=True, network_mode="host")

    ours = {LABEL_PREFIX: prefix, LABEL_NODE: "n1", LABEL_POOL: "farm"}
    running = [make(f"w{i}", dict(ours, **{LABEL_WORKER: f"n1-farm-w{i}", LABEL_ROLE: "worker"})) for i in (1, 2)]
    exited = make("w3", dict(ours, **{LABEL_WORKER: "n1-farm-w3", LABEL_ROLE: "worker"}), ["python", "-c", "pass"])
    fn_of_adopted = make("fn1", dict(ours, **{LABEL_WORKER: "n1-farm-w1", LABEL_ROLE: "function"}))
    fn_of_removed = make("fn2", dict(ours, **{LABEL_WORKER: "n1-farm-w2", LABEL_ROLE: "function"}))
    others = [
        make("other-pool", dict(ours, **{LABEL_POOL: "default", LABEL_ROLE: "worker"})),
        make("other-node", dict(ours, **{LABEL_NODE: "n2", LABEL_ROLE: "worker"})),
        make("other-prefix", dict(ours, **{LABEL_PREFIX: prefix + "x", LABEL_ROLE: "worker"})),
        make("unlabelled", {}),
    ]
    try:
        adopted = await runtime.adopt_or_remove(keep=1)
        assert [w.name for w in adopted] == ["n1-farm-w1"]
        await adopted[0].wait_ready(10)                      # READY is read from its log stream
        remaining = {c.id for c in docker_client.containers.list(all=True)}
        assert running[0].id in remaining and fn_of_adopted.id in remaining
        assert not {running[1].id, exited.id, fn_of_removed.id} & remaining
        assert {c.id for c in others} <= remaining

        adopted[0].kill()                                    # the adopted one is fully ours again
        assert await asyncio.wait_for(adopted[0].wait(), 30) == 128 + signal.SIGKILL
        assert fn_of_adopted.id not in {c.id for c in docker_client.containers.list(all=True)}
    finally:
        for container in [*running, exited, fn_of_adopted, fn_of_removed, *others]:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


async def test_a_stale_container_of_another_owner_is_not_replaced(runtime, docker_client, worker_image, prefix):
    squatter = docker_client.containers.run(worker_image, entrypoint=["sleep", "600"],
                                            name=runtime.container_name("n1-w1"), detach=True)
    try:
        with pytest.raises(RuntimeError, match="not this pool's"):
            await runtime.start("n1-w1", {})
        assert docker_client.containers.get(squatter.id).status == "running"
    finally:
        squatter.remove(force=True)


def test_listing_lists_again_when_a_container_goes_away_while_it_is_inspected():
    """docker-py lists the containers, then inspects each: one removed in between (a worker
    stopping during a scale-down) failed the whole listing with NotFound. Pure unit test: the
    race cannot be timed on a real engine, so the client answers as one that lost it twice."""
    class Containers:
        calls = 0

        def list(self, **kwargs):
            self.calls += 1
            if self.calls <= 2:
                raise docker.errors.NotFound("No such container: 0be8a41b2de2")
            return [kwargs["filters"]["label"]]

    client = type("Client", (), {"containers": Containers()})()
    assert list_containers(client, {LABEL_PREFIX: "t0", LABEL_ROLE: "worker"}) == [[f"{LABEL_PREFIX}=t0", f"{LABEL_ROLE}=worker"]]
    assert client.containers.calls == 3
    client.containers.calls = -10   # never answers: the last NotFound is raised, not swallowed
    with pytest.raises(docker.errors.NotFound):
        list_containers(client, {LABEL_PREFIX: "t0"})
