"""P2PFaaS machines that speak HTTP: joining, polls, death, and no resurrection by gossip (pure)."""

from __future__ import annotations

from nodes.discovery.machines import MachineTable, valid_ip


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


def test_addresses_as_p2pfaas_reads_them():
    assert valid_ip("10.0.0.5:19000") == "10.0.0.5" and valid_ip("::1") == "::1"
    assert valid_ip("example.org") is None and valid_ip("") is None
