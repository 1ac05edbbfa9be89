"""Request ids: unique, valid subject tokens, and a forked child never repeats its parent's."""

from __future__ import annotations

import os

from broker.client import new_request_id
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
