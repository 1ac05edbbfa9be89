"""Functions deployed at run time: the deployment's catalogue (every node converges on it, a
restart reads it), each node's record (``functions.json``: a broken one is refused by name, never
overwritten), and what is checked before anything changes."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

from broker.codec import encode
from broker.control import control_request
from broker.errors import NodeFileError
from broker.messages import FunctionDeployment, FunctionScale
from broker.subjects import Subjects
from nodes.node import Node
from nodes.settings import NodeSettings
from support import wait_until


@pytest.mark.parametrize("content, reason", [
    (b'[["echo2", "functions.builtins:ec', "unexpected end of data"),   # cut by a crash mid-write
    (b"", "empty document"),
    (b'{"echo2": "functions.builtins:echo"}', 'a JSON list of ["name", "reference"] pairs'),
    (b'[["echo2", 1]]', 'a JSON list of ["name", "reference"] pairs'),
    (b'[1]', 'a JSON list of ["name", "reference"] pairs'),
])
def test_a_broken_functions_file_is_refused_by_name_and_kept(tmp_path, content, reason):
    settings = NodeSettings(node_id="n1", data_dir=tmp_path, learner=False)
    path = settings.node_dir / "functions.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(NodeFileError) as refused:
        Node(settings)
    message = str(refused.value)
    assert message.startswith(f"{path} is not valid (") and reason in message and "\n" not in message
    assert message.endswith("fix it, or delete it to start without the functions deployed at run time")
    assert path.read_bytes() == content


def no_space(fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_a_deploy_or_delete_on_a_full_disk_still_applies_and_says_so(node_factory, nc, prefix, faas, monkeypatch,
                                                                         caplog):
    """The catalogue holds the deployment's functions (a restart reads it); a node whose own record
    (functions.json) cannot be written still runs what it was given, and says it once per change."""
    s = Subjects(prefix)
    deploy = encode(FunctionDeployment(service="echo2", reference="functions.builtins:echo"))
    async with node_factory(k=1, runtime="inprocess") as node:
        path = node.settings.node_dir / "functions.json"
        monkeypatch.setattr(os, "fsync", no_space)
        status, body = await control_request(nc, s.functions("n1", "deploy"), deploy, timeout_s=30)
        monkeypatch.undo()
        assert status == 200, body
        assert (await faas.invoke("n1", "echo2", b"x", timeout_s=10)).output == b"x"   # registered and run
        assert "its record" in caplog.text and "No space left" in caplog.text and not path.exists()
        assert node.metrics.errors.labels(node="n1", kind="node_file_unwritten").value == 1

        monkeypatch.setattr(os, "fsync", no_space)
        status, body = await control_request(nc, s.functions("n1", "delete"),
                                             encode(FunctionScale(service="echo2")), timeout_s=30)
        monkeypatch.undo()
        assert status == 200, body
        assert node.registry.get("echo2") is None
        assert (await faas.invoke("n1", "echo2", b"y", timeout_s=10)).status == 404


async def test_an_image_function_is_refused_when_its_engine_is_not_there(node_factory, nc, prefix, faas, tmp_path,
                                                                        monkeypatch):
    """It was deployed, listed as available, and every call answered 500 DockerException."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    deploy = encode(FunctionDeployment(service="wc", reference="image:p2pfaas-fn-wordcount"))
    async with node_factory(k=1, runtime="inprocess") as node:
        status, body = await control_request(nc, Subjects(prefix).functions("n1", "deploy"), deploy, timeout_s=30)
        assert status == 400 and b"no Docker engine at unix://" in body and b"start one" in body, body
        assert node.registry.get("wc") is None and not (node.settings.node_dir / "functions.json").exists()
        assert (await faas.invoke("n1", "wc", b"x", timeout_s=10)).status == 404


async def test_a_function_deployed_on_one_node_runs_on_every_node(node_factory, nc, prefix, faas):
    """A deploy reached one node: n2 answered "unknown function" (and so did a forward to it)."""
    s = Subjects(prefix)

    async def ask(node: str, verb: str, message) -> int:
        status, body = await control_request(nc, s.functions(node, verb), encode(message), timeout_s=60)
        assert status == 200, body
        return status

    async with node_factory("n1", k=1, runtime="inprocess") as n1, node_factory("n2", k=1, runtime="inprocess") as n2:
        await ask("n1", "deploy", FunctionDeployment(service="echo2", reference="functions.builtins:echo"))
        assert n1.registry.get("echo2") is not None   # the node that took it answers once it has it
        await wait_until(lambda: n2.registry.get("echo2") is not None, timeout_s=30)
        assert (await faas.invoke("n2", "echo2", b"there", timeout_s=10)).output == b"there"

        async with node_factory("n3", k=1, runtime="inprocess") as n3:   # a node that comes later has it at once
            assert n3.registry.get("echo2") is not None
            assert (await faas.invoke("n3", "echo2", b"late", timeout_s=10)).output == b"late"
            await ask("n2", "delete", FunctionScale(service="echo2"))      # removed from any node: everywhere
            assert n2.registry.get("echo2") is None
            await wait_until(lambda: n1.registry.get("echo2") is None and n3.registry.get("echo2") is None,
                             timeout_s=30)
        assert (await faas.invoke("n1", "echo2", b"x", timeout_s=10)).status == 404

        # n3 is away while a function is deployed and another removed: it comes back with both changes
        await ask("n1", "deploy", FunctionDeployment(service="echo3", reference="functions.builtins:echo"))
        async with node_factory("n3", k=1, runtime="inprocess") as n3:
            assert n3.registry.get("echo3") is not None and n3.registry.get("echo2") is None
            status, body = await control_request(nc, s.functions("n3", "delete"),
                                                 encode(FunctionScale(service="nope")), timeout_s=30)
            assert status == 404 and b"no function 'nope' is deployed" in body


async def test_a_deployed_function_is_admitted_once_the_workers_that_run_it_are_there(node_factory, nc, prefix, faas):
    """A node took calls to a function it had just deployed before its new workers were ready: the
    old ones answered 404 "unknown function ... on worker" (seen once in CI on a node the deploy
    reached through the catalogue). Now a call the node admits runs, from the first one."""
    s = Subjects(prefix)
    async with node_factory("n1", k=2, runtime="process") as n1:
        deploying = asyncio.create_task(control_request(nc, s.functions("n1", "deploy"), encode(FunctionDeployment(
            service="echo4", reference="functions.builtins:echo")), timeout_s=60))
        await wait_until(lambda: n1.registry.get("echo4") is not None, timeout_s=60, interval_s=0.001)
        answer = await faas.invoke("n1", "echo4", b"first", timeout_s=30)   # at once: the first moment it is admitted
        assert answer.status == 200 and answer.output == b"first", answer.body
        status, body = await deploying
        assert status == 200, body
