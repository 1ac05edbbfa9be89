"""P2PFaaS machines that speak HTTP: joining, polls, death, and no resurrection by gossip (pure),
and the poller against a real HTTP server."""

from __future__ import annotations

import asyncio
import logging

from nodes.discovery.machines import Machine, MachinePoller, MachineTable, valid_ip
from support import wait_until


def table(nats_peers=(), dead_polls=3) -> MachineTable:
    return MachineTable(lambda: "10.0.0.1", lambda ip: ip in nats_peers, dead_polls=dead_polls, clock=lambda: 100.0)


def test_a_machine_joins_by_announcing_itself_never_ourselves_nor_a_nats_peer():
    t = table(nats_peers={"10.0.0.2"})
    assert t.announce("10.0.0.9", "m9", "g").id == "http-10-0-0-9"
    assert t.announce("10.0.0.1") is None and t.announce("10.0.0.2") is None
    assert [(m.ip, m.name, m.group_name) for m in t.alive()] == [("10.0.0.9", "m9", "g")]
    row = t.alive()[0].row()
    assert (row.ip, row.alive, row.protocol) == ("10.0.0.9", True, "http")


def test_failed_polls_kill_and_gossip_does_not_revive():
    t = table(dead_polls=3)
    t.announce("10.0.0.9")
    for _ in range(3):
        t.polled("10.0.0.9", None)
    assert t.alive() == [] and t.machines["10.0.0.9"].dead_polls == 3
    t.merge([{"ip": "10.0.0.9"}, {"ip": "10.0.0.8", "name": "m8"}, {"ip": "not-an-ip"}])
    assert [m.ip for m in t.alive()] == ["10.0.0.8"]   # the dead one stays dead, the new one joins
    t.announce("10.0.0.9")                            # only the machine itself brings it back
    assert [m.ip for m in t.alive()] == ["10.0.0.8", "10.0.0.9"]
    t.polled("10.0.0.9", 0.01)
    assert t.machines["10.0.0.9"].dead_polls == 0 and t.machines["10.0.0.9"].ping == 0.01


def test_a_machine_a_forward_could_not_reach_is_not_scheduled_until_it_shows_up():
    t = table()
    t.announce("10.0.0.9")
    t.announce("10.0.0.8")
    t.unreachable("10.0.0.9", "reset")
    assert [m.ip for m in t.schedulable()] == ["10.0.0.8"]
    assert [m.ip for m in t.alive()] == ["10.0.0.8", "10.0.0.9"]   # still listed and polled
    t.polled("10.0.0.9", None)                                      # a failed poll changes nothing
    t.merge([{"ip": "10.0.0.9"}])                                   # nor gossip
    assert [m.ip for m in t.schedulable()] == ["10.0.0.8"]
    t.polled("10.0.0.9", 0.01)                                      # it answered a poll: back
    assert [m.ip for m in t.schedulable()] == ["10.0.0.8", "10.0.0.9"]
    t.unreachable("10.0.0.9", "refused")
    t.announce("10.0.0.9")                                          # or it announced itself
    assert [m.ip for m in t.schedulable()] == ["10.0.0.8", "10.0.0.9"]


def test_addresses_as_p2pfaas_reads_them():
    assert valid_ip("10.0.0.5:19000") == "10.0.0.5" and valid_ip("::1") == "::1"
    assert valid_ip("example.org") is None and valid_ip("") is None
    # a scope id names an interface of the sender; what follows the % would end up in our URL
    assert valid_ip("fe80::1%eth0") is None and valid_ip("fe80::1%x#y") is None and valid_ip("fe80::1") == "fe80::1"
    for unreachable in ("0.0.0.0", "::", "224.0.0.1", "ff02::1", "255.255.255.255", "240.0.0.1:19000"):
        assert valid_ip(unreachable) is None, unreachable
    assert valid_ip("127.0.0.2") == "127.0.0.2"   # --loopback-hosts: node i on 127.0.0.i


async def test_one_machine_that_cannot_be_polled_does_not_stop_the_polling_of_the_others(caplog):
    """httpx raises InvalidURL (not an HTTPError) for ``fe80::1%x#y``: it escaped the poll and ended
    the poller's task, silently, and no machine was polled again."""
    polls = 0

    async def machine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal polls
        await reader.readuntil(b"\r\n\r\n")
        polls += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                     b"Connection: close\r\n\r\n[]")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(machine, "127.0.0.1", 0)
    t = table()
    t.announce("127.0.0.1")
    t.machines["fe80::1%x#y"] = Machine("fe80::1%x#y", "", "", 99)   # as one was accepted before
    poller = MachinePoller(t, lambda: {}, port=server.sockets[0].getsockname()[1], period_s=0.05, timeout_s=2.0)
    caplog.set_level(logging.WARNING, "nodes.discovery.machines")
    try:
        await poller.start()
        await wait_until(lambda: polls >= 3, timeout_s=10)
        assert poller._task is not None and not poller._task.done()
    finally:
        await poller.stop()
        server.close()
        await server.wait_closed()
    assert t.machines["fe80::1%x#y"].dead_polls >= 2 and t.machines["127.0.0.1"].dead_polls == 0
    assert any("poll of machine fe80::1%x#y failed: InvalidURL" in r.getMessage() for r in caplog.records)
