"""The one codec: contracts <-> bytes (pure)."""

from __future__ import annotations

import pydantic
import pytest

from broker.codec import decode, encode
from broker.errors import ContractError
from broker.messages import NodeConfiguration, Result, ScaleCommand, Timings


def test_round_trip():
    r = Result(request_id="r", client="c", fn="f", status=200, output="x", executed_by="n1", origin="n1",
               timings=Timings(total_s=0.5))
    assert decode(Result, encode(r)) == r


@pytest.mark.parametrize("data, fragment", [
    (b"{nope", "not valid JSON"),
    (b'{"parallel_running_functions_max": 0}', "parallel_running_functions_max"),
    (b'{"parallel_running_functions_max": 2, "surprise": 1}', "surprise"),
    (b"[]", "NodeConfiguration"),
])
def test_invalid_payloads_name_the_problem(data, fragment):
    with pytest.raises(ContractError, match=fragment):
        decode(NodeConfiguration, data)


def test_contracts_are_frozen():
    cmd = ScaleCommand(node="n1", pool="fib", target_workers=3)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        cmd.target_workers = 4  # type: ignore[misc]
    assert cmd.target_workers == 3


def test_batches_too_large_for_one_message_are_split_in_order():
    from broker.codec import ENTRY_ROOM, split_by_size

    limit = 9 * ENTRY_ROOM
    sizes = [4 * ENTRY_ROOM, 4 * ENTRY_ROOM, 100, 20 * ENTRY_ROOM, 0, 0]
    runs = list(split_by_size("abcdef", sizes, limit))
    assert runs == [["a"], ["b", "c"], ["d"], ["e", "f"]]   # in order; one too large alone gets its own run
    for run in runs:
        fits = sum(sizes["abcdef".index(x)] + ENTRY_ROOM for x in run) <= limit
        assert fits or len(run) == 1
    assert list(split_by_size([], [], limit)) == []
