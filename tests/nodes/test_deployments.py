"""Functions deployed at run time (``functions.json``): a broken file is refused by name, never
overwritten; a deploy or delete that cannot be written (a full disk) changes nothing."""

from __future__ import annotations

import errno
import os

import orjson
import pytest

from broker.codec import encode
from broker.control import control_request
from broker.errors import NodeFileError
from broker.messages import FunctionDeployment, FunctionScale
from broker.subjects import Subjects
from nodes.node import Node
from nodes.settings import NodeSettings


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


async def test_a_deploy_or_delete_on_a_full_disk_changes_nothing(node_factory, nc, prefix, faas, monkeypatch):
    """Before, the function was registered (calls admitted) and then the write failed: the caller got
    500, the workers were never replaced, and every call to it failed on the worker."""
    s = Subjects(prefix)
    deploy = encode(FunctionDeployment(service="echo2", reference="functions.builtins:echo"))
    async with node_factory(k=1, runtime="inprocess") as node:
        path = node.settings.node_dir / "functions.json"
        functions = list(node.settings.functions)
        monkeypatch.setattr(os, "fsync", no_space)
        status, body = await control_request(nc, s.functions("n1", "deploy"), deploy, timeout_s=30)
        monkeypatch.undo()
        assert status == 500 and b"deploy of echo2 refused, nothing changed" in body and b"No space left" in body
        assert node.registry.get("echo2") is None and node.settings.functions == functions and not path.exists()
        answer = await faas.invoke("n1", "echo2", b"x", timeout_s=10)
        assert answer.status == 404 and "this node has" in answer.message   # refused by the node, not a worker

        status, _ = await control_request(nc, s.functions("n1", "deploy"), deploy, timeout_s=30)
        assert status == 200 and ["echo2", "functions.builtins:echo"] in orjson.loads(path.read_bytes())
        assert (await faas.invoke("n1", "echo2", b"x", timeout_s=10)).output == b"x"

        saved = path.read_bytes()
        monkeypatch.setattr(os, "fsync", no_space)
        status, body = await control_request(nc, s.functions("n1", "delete"),
                                             encode(FunctionScale(service="echo2")), timeout_s=30)
        monkeypatch.undo()
        assert status == 500 and b"delete of echo2 refused, nothing changed" in body
        assert node.registry.get("echo2") is not None and path.read_bytes() == saved
        assert (await faas.invoke("n1", "echo2", b"y", timeout_s=10)).output == b"y"


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
