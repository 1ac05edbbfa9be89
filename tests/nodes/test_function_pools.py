"""A function's own pool (docs/compat.md, "Scaling a function"): scale to zero and back on its
next call (a cold start, measured and answered in a header), replicas that are that function's
only, the deployment's timeout and concurrency, its secrets and its memory limit."""

from __future__ import annotations

import hashlib
import os
import textwrap

import orjson
import pytest

from broker import headers as H
from broker.codec import decode, encode
from broker.control import control_request
from broker.messages import FunctionDeployment, FunctionInfo, FunctionScale, FunctionScaling, SecretChange
from broker.secrets import KEY_NAME, bucket_name
from broker.subjects import Subjects
from support import wait_until


@pytest.fixture
def pool_functions(tmp_path_factory, monkeypatch):
    """A user module outside the node's data dir, on PYTHONPATH (its workers import it)."""
    code = tmp_path_factory.mktemp("poolfns")
    (code / "poolfns.py").write_text(textwrap.dedent("""
        import hashlib, os, time
        import functions

        def who(payload: bytes) -> bytes:
            return f"{os.getpid()} {os.environ.get('COLOUR', '-')}".encode()

        def nap(payload: bytes) -> bytes:
            time.sleep(float(payload))
            return b"awake"

        def keeper(payload: bytes) -> bytes:
            return hashlib.sha256(functions.secret(payload.decode()).encode()).hexdigest().encode()

        def hog(payload: bytes) -> bytes:
            block = bytearray(int(payload) << 20)   # MiB
            return str(len(block)).encode()
    """))
    monkeypatch.setenv("PYTHONPATH", f"{code}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(code))
    return "poolfns"


async def ask(nc, prefix, verb, body, node="n1", timeout_s=60.0):
    status, data = await control_request(nc, Subjects(prefix).functions(node, verb),
                                         body if isinstance(body, bytes) else orjson.dumps(body), timeout_s)
    return status, data


async def deploy(nc, prefix, **fields):
    status, data = await ask(nc, prefix, "deploy", encode(FunctionDeployment(**fields)))
    assert status == 200, data
    return decode(FunctionInfo, data)


async def test_a_function_scaled_to_zero_answers_its_first_call_and_sleeps_again(node_factory, nc, prefix, faas,
                                                                                 pool_functions):
    async with node_factory(k=2, runtime="process") as node:
        info = await deploy(nc, prefix, service="who", reference=f"{pool_functions}:who",
                            scaling=FunctionScaling(min=0, max=4, zero_after_s=1.5))
        assert (info.replicas, info.labels["p2pfaas.pool"], info.labels["com.openfaas.scale.zero"]) == (0, "who", "true")
        pool = node.pools["who"]
        assert pool.target == 0 and not pool.workers                # deployed asleep: nothing runs
        main = node.pool.target
        for round_ in range(2):
            answer = await faas.invoke("n1", "who", b"x", timeout_s=30)
            assert answer.status == 200, answer.body
            cold = float(answer.headers[H.COLD_START])
            assert 0 < cold <= answer.timings.queueing_s + 1e-6      # the wait is in the queueing time
            assert pool.target == 1 and node.pool.target == main       # one worker, the main pool untouched
            warm = await faas.invoke("n1", "who", b"x", timeout_s=10)
            assert warm.status == 200 and H.COLD_START not in warm.headers
            await wait_until(lambda: pool.target == 0 and not pool.workers, timeout_s=15)   # idle 1.5 s: zero
        series = node.metrics.cold_starts.labels(node="n1", pool="who")
        assert sum(series.counts) == 2 and series.sum > 0
        status, data = await ask(nc, prefix, "list", {})
        assert {f["name"]: f["replicas"] for f in orjson.loads(data)}["who"] == 0


async def test_an_async_call_wakes_a_pool_and_its_result_says_the_cold_start(node_factory, nc, prefix, faas,
                                                                             pool_functions):
    async with node_factory(k=1, runtime="inprocess"):
        await deploy(nc, prefix, service="who", reference=f"{pool_functions}:who", scaling=FunctionScaling(min=0))
        answer = await faas.call_async("n1", "who", b"x", timeout_s=30)
        assert answer.status == 200 and answer.timings.cold_start_s > 0


async def test_replicas_are_the_functions_own(node_factory, nc, prefix, faas, pool_functions):
    """OpenFaaS's scale-function sets that function's replicas, not the node's K; a function of the
    main pool scaled by hand gets a pool of its own (0: asleep until its next call)."""
    async with node_factory(k=2, runtime="inprocess") as node:
        for name in ("who", "nap"):
            await deploy(nc, prefix, service=name, reference=f"{pool_functions}:{name}",
                         scaling=FunctionScaling(min=1, max=5, policy="off"))
        status, data = await ask(nc, prefix, "scale", encode(FunctionScale(service="who", replicas=3)))
        assert status == 200 and decode(FunctionInfo, data).replicas == 3
        await node.pools["who"].wait_ready(20)
        assert (node.pools["who"].ready, node.pools["nap"].target, node.pool.target) == (3, 1, 2)
        status, data = await ask(nc, prefix, "scale", encode(FunctionScale(service="nap", replicas=9)))
        assert status == 400 and b"between 1 and 5" in data           # said, not clamped in silence
        status, data = await ask(nc, prefix, "scale", encode(FunctionScale(service="echo", replicas=0)))
        assert status == 200 and decode(FunctionInfo, data).labels["p2pfaas.pool"] == "echo"
        assert node.pools["echo"].target == 0 and node.pool.target == 2
        answer = await faas.invoke("n1", "echo", b"hi", timeout_s=20)
        assert answer.output == b"hi" and H.COLD_START in answer.headers and node.pools["echo"].target == 1


async def test_a_deployments_timeout_concurrency_and_environment_are_its_own(node_factory, nc, prefix, faas,
                                                                             pool_functions):
    async with node_factory(k=2, runtime="process") as node:
        await deploy(nc, prefix, service="nap", reference=f"{pool_functions}:nap", timeout_s=0.5, concurrency=3)
        assert node.registry.get("nap").concurrency == 3
        late = await faas.invoke("n1", "nap", b"2", timeout_s=20)
        assert late.status == 504 and "0.5" in late.body.decode()
        # two functions of their own pools may set the same variable differently (shared workers may not)
        for colour in ("red", "blue"):
            await deploy(nc, prefix, service=f"who-{colour}", reference=f"{pool_functions}:who",
                         env_vars={"COLOUR": colour}, scaling=FunctionScaling(policy="off"))
        outputs = [(await faas.invoke("n1", f"who-{c}", b"x", timeout_s=20)).output.split()[1] for c in ("red", "blue")]
        assert outputs == [b"red", b"blue"]


async def test_a_secret_reaches_only_its_function_and_is_stored_sealed(node_factory, nc, prefix, faas,
                                                                       pool_functions, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv(KEY_NAME, "a-test-key")
    value = "hunter2-" + os.urandom(8).hex()
    async with node_factory(k=1, runtime="process") as node:
        status, data = await ask(nc, prefix, "secrets_set", encode(SecretChange(name="db-password", value=value)))
        assert status == 200, data
        status, data = await ask(nc, prefix, "secrets_list", {})
        assert orjson.loads(data) == [{"name": "db-password"}]       # names only
        status, data = await ask(nc, prefix, "deploy", encode(FunctionDeployment(
            service="keeper2", reference=f"{pool_functions}:keeper", secrets=["no-such"])))
        assert status == 404 and b"no secret 'no-such'" in data      # refused, nothing deployed
        info = await deploy(nc, prefix, service="keeper", reference=f"{pool_functions}:keeper",
                            secrets=["db-password"])
        assert info.secrets == ["db-password"] and info.labels["p2pfaas.pool"] == "keeper"
        answer = await faas.invoke("n1", "keeper", b"db-password", timeout_s=30)
        assert answer.output == hashlib.sha256(value.encode()).hexdigest().encode()
        # another function's workers never had it
        await deploy(nc, prefix, service="snoop", reference=f"{pool_functions}:keeper")
        snooped = await faas.invoke("n1", "snoop", b"db-password", timeout_s=30)
        assert snooped.status == 500 and b"was not given to this function" in snooped.body
        status, data = await ask(nc, prefix, "secrets_delete", encode(SecretChange(name="db-password")))
        assert status == 409 and b"keeper" in data                   # in use
        stored = await (await nc.jetstream().key_value(bucket_name(Subjects(prefix)))).get("db-password")
        files = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
        worker_env = b"".join(open(f"/proc/{pid}/environ", "rb").read() for pid in node.pools["keeper"].pids())
    assert value.encode() not in stored.value and value not in caplog.text
    assert value.encode() not in files and value.encode() not in worker_env


async def test_a_memory_limit_holds_a_worker_process(node_factory, nc, prefix, faas, pool_functions):
    async with node_factory(k=1, runtime="process"):
        status, data = await ask(nc, prefix, "deploy", {"service": "hog", "reference": f"{pool_functions}:hog",
                                                        "limits": {"cpus": 0.5}})
        assert status == 400 and b"CPU limit" in data
        await deploy(nc, prefix, service="hog", reference=f"{pool_functions}:hog",
                     limits={"memory_bytes": 256 << 20})
        assert (await faas.invoke("n1", "hog", b"16", timeout_s=30)).status == 200
        over = await faas.invoke("n1", "hog", b"512", timeout_s=30)
        assert over.status == 500 and b"MemoryError" in over.body
        assert (await faas.invoke("n1", "hog", b"16", timeout_s=30)).status == 200   # its worker goes on


async def test_a_removed_functions_pool_goes_with_it(node_factory, nc, prefix, faas, pool_functions):
    async with node_factory(k=1, runtime="inprocess") as node:
        await deploy(nc, prefix, service="who", reference=f"{pool_functions}:who", scaling=FunctionScaling(min=1))
        await node.pools["who"].wait_ready(20)
        status, _ = await ask(nc, prefix, "delete", encode(FunctionScale(service="who")))
        assert status == 200 and "who" not in node.pools and "who" not in node.scheduler.pool_of
        assert (await faas.invoke("n1", "who", b"x", timeout_s=10)).status == 404
