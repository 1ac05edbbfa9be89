"""Request ids: unique, valid subject tokens, and a forked child never repeats its parent's; the
wait a call says its caller gives it."""

from __future__ import annotations

import math
import os

import pytest

from broker import headers as H
from broker.client import _say_wait, new_request_id
from broker.subjects import check_token


def test_request_ids_are_unique_tokens_of_32_hex_digits():
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for req in ids[:100]:
        assert len(req) == 32 and int(req, 16) >= 0 and check_token(req, "request id") == req


def test_a_forked_child_draws_ids_of_its_own():
    parent = new_request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its next id, then out at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert status == 0 and len(child) == 32
    assert child[:16] != parent[:16]          # its own random start, not its parent's
    assert new_request_id() != child


@pytest.mark.parametrize("asked, timeout_s, sent", [
    (None, 60.0, "60.0"),            # the client's own wait
    ("2.5", 60.0, "2.5"),            # a caller's shorter one
    ("3600", 5.0, "5.0"),            # never longer than the client waits: it would be queued for nobody
    ("abc", 5.0, "abc"),             # left for the node to refuse (400 with the header's name)
    (None, math.inf, None),          # a client that waits for ever says nothing
])
def test_a_call_says_how_long_its_caller_waits(asked, timeout_s, sent):
    headers = {} if asked is None else {H.WAIT: asked}
    _say_wait(headers, timeout_s)
    assert headers.get(H.WAIT) == sent
