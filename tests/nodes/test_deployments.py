"""Functions deployed at run time (``functions.json``): a broken file is refused by name, never
overwritten."""

from __future__ import annotations

import pytest

from broker.errors import NodeFileError
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

