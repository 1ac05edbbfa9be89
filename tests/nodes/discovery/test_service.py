"""The discovery service against a real nats-server: join, suspect, remove, no stale resurrection, probes."""

from __future__ import annotations

import contextlib
import errno
import os
import time

import pytest

from broker.codec import decode, encode
from broker.control import ControlError
from broker.errors import NodeFileError
from broker.messages import Heartbeat, MachineAnnouncement, NodeLoad, PeerList
from broker.subjects import Subjects
from nodes.discovery.membership import PeerStatus
from nodes.discovery.service import DiscoveryService
from nodes.settings import NodeSettings
from support import wait_until

PERIOD = 0.1


def idle(node: str):
    return lambda: NodeLoad(node=node, running=0, queued=0, parallel_running_functions_max=2,
                            queue_length_max=0, queue_enabled=False)


@pytest.fixture
def discovery(nc, prefix, tmp_path):
    """``async with discovery("n1") as d`` — a DiscoveryService with a short period on the test's prefix
    (and its own data dir: a configuration it saves is not the next test's)."""

    @contextlib.asynccontextmanager
    async def make(node: str, **overrides):
        overrides.setdefault("data_dir", tmp_path)
        settings = NodeSettings(node_id=node, prefix=prefix, heartbeat_period_s=PERIOD, learner=False, suspect_after=2,
                                remove_after=4, probe_timeout_s=0.2, address=f"http://{node}", **overrides)
        async with DiscoveryService(settings, nc, idle(node)) as service:
            yield service

    return make


async def test_join_suspect_remove_and_rejoin(discovery):
    async with discovery("n1") as n1:
        async with discovery("n2"), discovery("n3") as n3:
            await wait_until(lambda: n1.peers() == ["n2", "n3"] and n3.peers() == ["n1", "n2"], 5)
        # n2 and n3 went silent: one missed period is not enough to suspect them ...
        assert n1.peers() == ["n2", "n3"]
        # ... more than 2 periods are (suspected: no longer offered), more than 4 remove them
        await wait_until(lambda: n1.peers() == [], 5)
        assert n1.view.status("n2", time.time()) in (PeerStatus.SUSPECTED, PeerStatus.REMOVED)
        await wait_until(lambda: n1.view.status("n2", time.time()) is PeerStatus.REMOVED, 5)
        async with discovery("n2"):  # a restarted peer is back with its first fresh heartbeat
            await wait_until(lambda: n1.peers() == ["n2"], 5)


async def test_stale_heartbeat_does_not_resurrect(discovery, nc, prefix):
    s = Subjects(prefix)
    async with discovery("n1") as n1:
        async with discovery("n2"):
            await wait_until(lambda: n1.peers() == ["n2"], 5)
            last = n1.view.heartbeat("n2")
        await wait_until(lambda: n1.view.status("n2", time.time()) is PeerStatus.REMOVED, 5)
        # replayed gossip: the newest heartbeat n2 ever sent, and an older one
        for stale in (last, last.model_copy(update={"time": last.time - 5})):
            await nc.publish(s.membership("n2"), encode(stale))
        # a marker on the same subject: once n1 has it, it has handled the replays (same subscription, in order)
        await nc.publish(s.membership("marker"), encode(Heartbeat(node="marker", time=time.time())))
        await wait_until(lambda: "marker" in n1.peers(), 5)
        assert n1.peers() == ["marker"] and n1.view.status("n2", time.time()) is PeerStatus.REMOVED
        fresh = Heartbeat(node="n2", time=time.time())
        await nc.publish(s.membership("n2"), encode(fresh))
        await wait_until(lambda: "n2" in n1.peers(), 5)


async def test_peer_list_in_p2pfaas_format(discovery, nc, prefix):
    async with discovery("n1", group="edge"), discovery("n2", group="edge") as n2:
        await wait_until(lambda: n2.peers() == ["n1"], 5)
        reply = await nc.request(Subjects(prefix).peers("n2"), b"", timeout=5)
    rows = decode(PeerList, reply.data).root
    assert [r.name for r in rows] == ["n1"]
    row = reply.data.decode()
    assert '"_id"' in row and '"group_name":"edge"' in row and '"ip":"n1"' in row and '"address":"http://n1"' in row
    assert rows[0].alive and rows[0].dead_polls <= 2


async def test_probe_answers_load_and_failures_are_none(discovery, nc, prefix):
    s = Subjects(prefix)

    async def answer(msg):
        await nc.publish(msg.reply, encode(NodeLoad(node="n2", running=2, queued=3, parallel_running_functions_max=2,
                                                    queue_length_max=4, queue_enabled=True)))

    async def hang(msg):  # a peer that is alive but never answers in time
        return None

    async def garbage(msg):
        await nc.publish(msg.reply, b"{not json")

    subs = [await nc.subscribe(s.load("n2"), cb=answer), await nc.subscribe(s.load("slow"), cb=hang),
            await nc.subscribe(s.load("bad"), cb=garbage)]
    try:
        async with discovery("n1") as n1:
            assert await n1.probe("n2") == 5
            started = time.monotonic()
            assert await n1.probe("slow") is None
            assert 0.15 < time.monotonic() - started < 2.0   # bounded by probe_timeout_s
            assert await n1.probe("bad") is None
            assert await n1.probe("nobody") is None          # no responders: at once
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def test_heartbeats_from_the_future_or_on_another_nodes_subject_are_refused(discovery, nc, prefix):
    s = Subjects(prefix)
    async with discovery("n1") as n1, discovery("n2"):
        await wait_until(lambda: n1.peers() == ["n2"], 5)
        year_2100 = Heartbeat(node="n2", time=4102444800.0)            # would outrank every true heartbeat
        await nc.publish(s.membership("n2"), encode(year_2100))
        impostor = Heartbeat(node="n2", time=time.time() + 1)         # n9 speaking for n2
        await nc.publish(s.membership("n9"), encode(impostor))
        await nc.flush()
        last = n1.view.heartbeat("n2").time
        await wait_until(lambda: n1.view.heartbeat("n2").time > last, 5)   # n2's own heartbeats still count
        assert n1.view.heartbeat("n2").time < time.time() + 60 and n1.peers() == ["n2"]


@pytest.mark.parametrize("content", [b"", b'{"machine_group_name": "edge", "init_ser', b'{"init_servers": "10.0.0.9"}'])
async def test_a_broken_discovery_file_is_refused_by_name_and_kept(discovery, tmp_path, content):
    """Read as absent, it was overwritten at the next change: the group and init servers set at run time lost."""
    path = tmp_path / "nodes" / "n1" / "discovery.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(NodeFileError) as refused:
        async with discovery("n1", data_dir=tmp_path):
            pass
    assert str(refused.value).startswith(f"{path} is not valid (") and "\n" not in str(refused.value)
    assert str(refused.value).endswith("fix it, or delete it to start with the group and init servers of the settings")
    assert path.read_bytes() == content


async def test_a_configuration_change_on_a_full_disk_changes_nothing(discovery, tmp_path, monkeypatch):
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    change = b'{"machine_group_name": "edge", "init_servers": ["10.0.0.9"]}'
    async with discovery("n1", data_dir=tmp_path, group="core") as n1:
        path = n1.settings.node_dir / "discovery.json"
        monkeypatch.setattr(os, "fsync", no_space)
        with pytest.raises(ControlError, match="configuration not changed: .*No space left") as refused:
            await n1.on_config_set(change)
        monkeypatch.undo()
        assert refused.value.status == 500 and not path.exists()
        assert (n1.settings.group, n1.settings.init_servers, n1.machines.machines) == ("core", [], {})
        await n1.on_config_set(change)
    async with discovery("n1", data_dir=tmp_path) as again:   # kept across a restart
        assert (again.settings.group, again.settings.init_servers) == ("edge", ["10.0.0.9"])


async def test_an_address_with_a_scope_id_is_refused(discovery, tmp_path):
    """``fe80::1%x#y`` was taken as an address; its URL made httpx raise InvalidURL in the poller."""
    async with discovery("n1", data_dir=tmp_path) as n1:
        for ip in ("fe80::1%x#y", "fe80::1%eth0"):
            with pytest.raises(ControlError, match="is not an IP address"):
                await n1.on_register(encode(MachineAnnouncement(ip=ip)))
        with pytest.raises(ControlError, match="init_servers must be IP addresses"):
            await n1.on_config_set(b'{"init_servers": ["fe80::1%x#y"]}')
        assert n1.machines.machines == {}


async def test_a_node_hears_only_its_group_and_moves_with_it(discovery, nc, prefix):
    """Heartbeats stay within a group (P2PFaaS's fog network id): a node's membership traffic grows
    with its group, not with the deployment; a group changed at run time is heard from then on."""
    from support import Collector

    s = Subjects(prefix)
    async with Collector(nc, s.all_membership("rack-a")) as rack_a, \
            discovery("n1", group="rack-a") as n1, discovery("n2", group="rack-a") as n2, \
            discovery("n3", group="rack-b") as n3, discovery("n4", group="rack b?") as n4:
        await wait_until(lambda: n1.peers() == ["n2"] and n2.peers() == ["n1"], 5)
        assert n3.peers() == [] and n4.peers() == []
        assert {decode(Heartbeat, m.data).node for m in rack_a.messages} == {"n1", "n2"}
        await n3.on_config_set(b'{"machine_group_name": "rack-a"}')
        await wait_until(lambda: n1.peers() == ["n2", "n3"] and n3.peers() == ["n1", "n2"], 5)
        assert n4.peers() == []   # a group name that is no subject token has one of its own
        assert s.all_membership("rack b?") != s.all_membership("rack-b")
