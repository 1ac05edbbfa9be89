"""Worker pools of containers end to end: a node with ``runtime="docker"`` serves, scales up and
down, loses nothing when its containers are killed mid-task, and runs image functions."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from broker.codec import decode
from broker.messages import Result
from broker.subjects import Subjects
from nodes.runtimes.docker import LABEL_NODE, LABEL_PREFIX, LABEL_ROLE, LABEL_WORKER, list_containers
from support import Collector, wait_until


def containers(client, prefix: str, role: str = "worker", status: str | None = None):
    found = list_containers(client, {LABEL_PREFIX: prefix, LABEL_NODE: "n1", LABEL_ROLE: role})
    return [c for c in found if status is None or c.status == status]


async def set_k(nc, prefix: str, k: int) -> None:
    body = orjson.dumps({"parallel_running_functions_max": k, "queue_length_max": 50})
    reply = await nc.request(Subjects(prefix).config("n1", "set"), body, timeout=10)
    assert reply.headers["X-P2pfaas-Status"] == "200", reply.data


async def test_docker_pool_serves_scales_and_loses_nothing_when_containers_are_killed(
        node_factory, docker_client, worker_image, nc, faas, prefix):
    s = Subjects(prefix)
    async with node_factory(k=2, queue=50, ack_wait_s=2.0, runtime="docker", docker_image=worker_image) as node:
        answer = await faas.invoke("n1", "echo", b"from a container", timeout_s=30)
        assert answer.status == 200 and answer.output == b"from a container"
        assert len(containers(docker_client, prefix, status="running")) == 2

        await set_k(nc, prefix, 6)                                      # scale up: 4 more containers
        await node.pool.wait_ready(90)
        running = containers(docker_client, prefix, status="running")
        assert len(running) == 6
        assert {c.labels[LABEL_WORKER] for c in running} == {w.name for w in node.pool.workers}

        await set_k(nc, prefix, 2)                                      # scale down: 4 stop and go
        await wait_until(lambda: len(containers(docker_client, prefix)) == 2, timeout_s=60, interval_s=0.2)
        assert node.pool.ready == 2

        ids = [f"kill{i}" for i in range(6)]
        async with Collector(nc, s.results_of("dev1")) as results:
            for req in ids:
                await faas.submit("n1", "sleep", b"0.5", req)
            await wait_until(lambda: node.scheduler.main.n_running >= 2, timeout_s=30)
            for victim in containers(docker_client, prefix, status="running"):   # both, mid-task
                victim.kill()
            await wait_until(lambda: len({m.subject for m in results.messages}) == len(ids), timeout_s=90,
                             interval_s=0.1)
            await asyncio.sleep(2.5)  # one ack_wait: the window in which a duplicate would show up
        answers = [decode(Result, m.data) for m in results.messages]
        assert {a.request_id for a in answers} == set(ids)               # every task answered
        assert all(a.status == 200 for a in answers)
        assert len(answers) == len(ids)   # the node stores one answer per request id: no duplicate
        assert node.metrics.errors.labels(node="n1", kind="worker_lost").value >= 2   # they really died
        await node.pool.wait_ready(60)                                  # the killed ones were replaced
        assert len(containers(docker_client, prefix, status="running")) == 2
    # the node stops what it started (each container is removed as its exit is seen)
    await wait_until(lambda: containers(docker_client, prefix) == [], timeout_s=30, interval_s=0.2)


@pytest.mark.parametrize("runtime", ["process", "docker"])
async def test_image_function_runs_in_the_workers_own_container(
        node_factory, docker_client, worker_image, function_image, faas, prefix, runtime):
    fns = [("wc", f"image:{function_image}")]
    async with node_factory(k=1, runtime=runtime, docker_image=worker_image, functions=fns) as node:
        answer = await faas.invoke("n1", "wc", "hello p2pfaas\nbye".encode(), timeout_s=90)
        assert answer.status == 200, answer.message
        assert orjson.loads(answer.output) == {"lines": 1, "words": 3, "bytes": 17}
        assert answer.timings.execution_s > 0
        bad = await faas.invoke("n1", "wc", b"\xff\xfe", timeout_s=30)      # the handler's ValueError
        assert bad.status == 400 and "UTF-8" in bad.message
        [fn_container] = containers(docker_client, prefix, role="function", status="running")
        assert fn_container.labels[LABEL_WORKER] == node.pool.workers[0].name
        assert fn_container.image.tags[0] == function_image
    await wait_until(lambda: containers(docker_client, prefix, role="function") == [], timeout_s=30, interval_s=0.2)


def test_an_image_function_is_checked_on_the_engine_before_anything_starts(docker_client, function_image, capsys):
    """`up --function` asks the engine for the image at once; a missing one is one clear line."""
    import typer

    from p2pfaas.cli_common import _importable

    _importable([("wc", f"image:{function_image}")])
    with pytest.raises(typer.Exit) as stopped:
        _importable([("nope", "image:p2pfaas-no-such-image:1")])
    assert stopped.value.exit_code == 2
    assert ("--function nope=image:p2pfaas-no-such-image:1: image p2pfaas-no-such-image:1 is not on the Docker "
            "engine at") in " ".join(capsys.readouterr().err.split())


def test_up_runs_its_workers_as_containers(docker_client, worker_image, tmp_path):
    """`up --runtime docker` did not exist: container pools were reachable from Python only."""
    import signal
    import subprocess
    import time

    import httpx

    from broker.embedded import free_port
    from stack_processes import P2PFAAS, UpRuns, wait_endpoints

    runs = UpRuns()
    try:
        proc = runs(tmp_path, "--runtime", "docker", "--worker-image", worker_image, "--http-port", "0",
                    "--nats-port", str(free_port()), "--mqtt", "off", "--controller", "off")
        http = wait_endpoints(proc, tmp_path, timeout_s=120)["http"]["n1"]
        answer = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:   # the containers boot after `up` has printed its endpoints
            answer = httpx.post(f"{http}/function/fib", content=b"20", timeout=60)
            if answer.status_code == 200:
                break
            time.sleep(0.5)
        assert answer is not None and answer.status_code == 200 and answer.text == "6765", answer
        running = containers(docker_client, "faas", status="running")
        assert running and all(c.image.tags[0] == worker_image for c in running)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    finally:
        runs.end()
    assert containers(docker_client, "faas") == []   # its workers go with it
    missing = subprocess.run([*P2PFAAS, "up", "--runtime", "docker", "--worker-image",
                              "p2pfaas-no-such-worker:1", "--data-dir", str(tmp_path / "other")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "image p2pfaas-no-such-worker:1 is not on the Docker engine" in missing.stderr
    assert "p2pfaas image build" in missing.stderr and not (tmp_path / "other").exists()


async def test_an_image_function_deployed_once_runs_on_every_node_with_its_secrets_and_limits(
        node_factory, docker_client, function_image, nats_server, nc, faas, prefix, monkeypatch):
    """Deployed once from the CLI (the catalogue), run on a node it was not deployed on, in a container
    with the deployment's limits, variables and secret (OpenFaaS's file, in no environment);
    described, and removed everywhere."""
    import os
    import subprocess

    from broker.codec import encode
    from broker.control import control_request
    from broker.messages import SecretChange
    from broker.secrets import KEY_NAME
    from stack_processes import P2PFAAS

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*P2PFAAS, *args, "--nats-url", nats_server.url, "--prefix", prefix], capture_output=True,
                              text=True, timeout=180, env={**os.environ, "COLUMNS": "80"})

    monkeypatch.setenv(KEY_NAME, "a-docker-test-key")
    value = "k-" + os.urandom(6).hex()
    async with node_factory(node_id="n1", k=1, runtime="process") as n1, \
            node_factory(node_id="n2", k=1, runtime="process") as n2:
        status, data = await control_request(nc, Subjects(prefix).functions("n1", "secrets_set"),
                                             encode(SecretChange(name="api-key", value=value)), 30)
        assert status == 200, data
        done = await asyncio.to_thread(cli, "deploy", "wc", "--image", function_image, "-e", "MODE=count", "--secret",
                                       "api-key", "--memory-limit", "256Mi", "--cpu-limit", "0.5", "--policy", "off")
        assert done.returncode == 0 and done.stdout.strip() == "deployed wc on n1, n2", (done.stdout, done.stderr)
        answer = await faas.invoke("n2", "wc", b"one two", timeout_s=120)
        assert answer.status == 200 and orjson.loads(answer.output)["words"] == 2, answer.message
        [container] = [c for c in list_containers(docker_client, {LABEL_PREFIX: prefix, LABEL_NODE: "n2",
                                                                  LABEL_ROLE: "function"}) if c.status == "running"]
        host = container.attrs["HostConfig"]
        assert (host["Memory"], host["NanoCpus"]) == (256 << 20, 500_000_000)
        code, out = container.exec_run(["cat", "/var/openfaas/secrets/api-key"])
        assert code == 0 and out.decode() == value
        assert not any(value in item for item in container.attrs["Config"]["Env"])
        assert "MODE=count" in container.attrs["Config"]["Env"]
        described = await asyncio.to_thread(cli, "describe", "wc", "--node", "n2")
        assert f"image        {function_image}" in described.stdout and "secrets      api-key" in described.stdout
        assert "limits       cpu 0.5, memory 256Mi" in described.stdout and "  MODE=count" in described.stdout
        removed = await asyncio.to_thread(cli, "remove", "wc")
        assert removed.returncode == 0 and removed.stdout.strip() == "removed wc on n1, n2", removed.stderr
        assert n1.registry.get("wc") is None and n2.registry.get("wc") is None
