"""The dashboard's live feed: the pure bookkeeping, then the feed on a real nats-server."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from broker.codec import encode
from broker.messages import (Heartbeat, LearnerWeights, PoolTelemetry, ScaleCommand, ScalingExperience,
                             SchedulerConfiguration, SchedulingExperience)
from broker.subjects import Subjects
from broker.ui_feed import DashboardFeed, FeedClient, ForwardWindow, LearningCounts, NodeTrack
from support import Collector, wait_until


def heartbeat(node: str = "n1", at: float = 100.0, **fields) -> Heartbeat:
    return Heartbeat(node=node, time=at, parallel_running_functions_max=4, queue_length_max=2, **fields)


def telemetry(node: str = "n1", pool: str = "farm", at: float = 100.0, **fields) -> PoolTelemetry:
    values = dict(node=node, pool=pool, time=at, period_s=1.0, queue_length=3, in_service=2, workers_ready=4,
                  workers_starting=1, arrivals=5, completed=4, met_deadline=3, arrival_rate=5.0, throughput=4.0,
                  latency_mean_s=0.5, latency_p95_s=0.9, latency_max_s=1.2, qos=0.75)
    return PoolTelemetry(**{**values, **fields})


# -- pure ----------------------------------------------------------------------------------------
def test_node_status_follows_the_heartbeat_period():
    track = NodeTrack(heartbeat(at=0.0), seen_at=0.0)
    for i in range(1, 6):
        track.observe(heartbeat(at=0.5 * i), now=0.5 * i)
    assert track.period_s == pytest.approx(0.5)
    assert track.status(2.5 + 1.4) == "alive"          # < 3 periods silent
    assert track.status(2.5 + 1.6) == "suspected"      # > 3 periods
    assert track.status(2.5 + 5.1) == "gone"           # > 10 periods


def test_a_newcomers_extra_heartbeat_does_not_shorten_the_period():
    track = NodeTrack(heartbeat(at=0.0), seen_at=0.0)
    for now in (1.0, 1.01, 2.0, 3.0, 4.0):
        track.observe(heartbeat(at=now), now)
    assert track.period_s == pytest.approx(1.0)


def test_forward_window_sums_the_last_minute_and_knows_when_nothing_is_reported():
    window = ForwardWindow(window_s=60)
    window.add("n1", None, at=0.0)
    assert not window.reported and window.totals(0.0) == {}
    window.add("n1", {"n2": 3, "n3": 0}, at=0.0)
    window.add("n1", {"n2": 2}, at=30.0)
    window.add("n2", {"n1": 1}, at=50.0)
    assert window.reported
    assert window.totals(55.0) == {"n1": {"n2": 5}, "n2": {"n1": 1}}
    assert window.totals(70.0) == {"n1": {"n2": 2}, "n2": {"n1": 1}}   # the first count left the window
    assert window.totals(200.0) == {}


def test_learning_counts_are_per_tick():
    counts = LearningCounts()
    counts.reward("n1", 1.0)
    counts.reward("n1", 0.0)
    counts.experience("n1", "farm", -0.5)
    assert counts.take() == {"rewards": {"n1": {"count": 2, "reward_sum": 1.0}},
                             "experiences": {"n1/farm": {"count": 1, "reward_sum": -0.5}}}
    assert counts.take() == {"rewards": {}, "experiences": {}}


async def test_a_page_too_slow_is_told_to_reconnect_and_memory_stays_bounded():
    client = FeedClient(size=3)
    for i in range(10):
        client.offer(f"event {i}")
    assert client.lagged and client.queue.qsize() == 1
    assert await client.next() is None


# -- on a real broker -------------------------------------------------------------------------------
class Page:
    """What an attached page receives, decoded."""

    def __init__(self, history: list[str], client: FeedClient) -> None:
        self.events = [orjson.loads(text) for text in history]
        self.client = client
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        while (text := await self.client.next()) is not None:
            self.events.append(orjson.loads(text))

    def of(self, kind: str) -> list[dict]:
        return [e["data"] for e in self.events if e["type"] == kind]

    def close(self) -> None:
        self._task.cancel()


@pytest.fixture
async def feed(nc, prefix):
    feed = DashboardFeed(nc, Subjects(prefix), tick_s=0.1)
    yield feed
    await feed.close()


async def test_feed_relays_the_brokers_own_telemetry(nc, prefix, feed):
    s = Subjects(prefix)
    page = Page(*await feed.attach())
    await nc.publish(s.membership("n1"), encode(heartbeat(at=1.0, scheduler="NoScheduler(true)", forwards={"n2": 4})))
    await nc.publish(s.membership("n2"), encode(heartbeat("n2", at=1.0)))
    await nc.publish(s.telemetry("n1", "farm"), encode(telemetry()))
    for target, policy in ((4, "kpa"), (6, "kpa"), (5, "manual")):
        await nc.publish(s.scale("n1", "farm"), encode(ScaleCommand(node="n1", pool="farm", target_workers=target,
                                                                    policy=policy, model_version="online-7")))
    await nc.publish(s.reward("n1"), encode(SchedulingExperience(eid=1, state=[0.0], action=1, reward=1.0)))
    await nc.publish(s.experience("n1", "farm"), encode(ScalingExperience(
        node="n1", pool="farm", observation=[0.0], action=1, reward=-0.25, next_observation=[0.0])))
    await nc.publish(s.learner("n1", "scaling-farm", "weights"), encode(LearnerWeights(
        node="n1", model="scaling-farm", algorithm="dqn", obs_dim=1, n_actions=3, config={}, version=42,
        weights_b64="AAAA")))
    await nc.publish(s.membership("n3"), b'{"node": "n3", "running": "lots"}')   # malformed: counted, ignored

    def learned() -> bool:
        ticks = page.of("tick")
        return any(t["learning"]["rewards"] for t in ticks) and any(t["learning"]["experiences"] for t in ticks) \
            and ticks[-1]["malformed"] == 1
    await wait_until(learned, 5)

    assert [hb["node"] for hb in page.of("heartbeat")] == ["n1", "n2"]
    assert page.of("telemetry") == [telemetry().model_dump(mode="json")]
    scale = page.of("scale")
    assert [(c["target_workers"], c["previous"], c["policy"], c["model_version"]) for c in scale] == \
        [(4, None, "kpa", "online-7"), (6, 4, "kpa", "online-7"), (5, 6, "manual", "online-7")]
    assert page.of("weights") == [{"node": "n1", "model": "scaling-farm", "algorithm": "dqn", "version": 42,
                                   "at": pytest.approx(page.of("weights")[0]["at"])}]
    tick = page.of("tick")[-1]
    assert tick["nodes"]["n1"]["status"] == "alive" and tick["nodes"]["n1"]["scheduler"] == "NoScheduler(true)"
    assert tick["forwards"] == {"n1": {"n2": 4}}
    rewards = [t["learning"]["rewards"] for t in page.of("tick") if t["learning"]["rewards"]]
    experiences = [t["learning"]["experiences"] for t in page.of("tick") if t["learning"]["experiences"]]
    assert rewards == [{"n1": {"count": 1, "reward_sum": 1.0}}]
    assert experiences == [{"n1/farm": {"count": 1, "reward_sum": -0.25}}]
    assert ("n1", "farm") in feed.pools

    # a second page starts from the history, in the same order
    second = Page(*await feed.attach())
    kinds = [e["type"] for e in second.events]
    assert kinds[:2] == ["heartbeat", "heartbeat"] and kinds.count("scale") == 3
    page.close(), second.close()


async def test_replayed_heartbeats_never_refresh_a_node(nc, prefix, feed):
    s = Subjects(prefix)
    page = Page(*await feed.attach())
    for at in (5.0, 4.0, 5.0, 6.0):
        await nc.publish(s.membership("n1"), encode(heartbeat(at=at)))
    await wait_until(lambda: len(page.of("heartbeat")) >= 2 and page.of("tick"), 5)
    await nc.flush()
    assert [hb["time"] for hb in page.of("heartbeat")] == [5.0, 6.0]
    page.close()


async def test_scheduler_is_asked_for_when_heartbeats_do_not_carry_it(nc, prefix, feed):
    s = Subjects(prefix)

    async def answer(msg):
        await msg.respond(encode(SchedulerConfiguration(name="PowerOfNScheduler", parameters=["1", "2", "true", "1"])))
    responder = await nc.subscribe(s.scheduler_config("n1", "get"), cb=answer)
    page = Page(*await feed.attach())
    await nc.publish(s.membership("n1"), encode(heartbeat()))
    await wait_until(lambda: any(t["nodes"].get("n1", {}).get("scheduler") for t in page.of("tick")), 5)
    assert page.of("tick")[-1]["nodes"]["n1"]["scheduler"] == "PowerOfNScheduler(1, 2, true, 1)"
    await responder.unsubscribe()
    page.close()


async def test_the_feed_subscribes_only_while_a_page_is_open(nc, prefix, feed):
    s = Subjects(prefix)
    before = len(nc._subs)
    history, client = await feed.attach()
    assert len(nc._subs) == before + 6
    other = await feed.attach()
    await feed.detach(client)
    assert len(nc._subs) == before + 6          # one page is still open
    await feed.detach(other[1])
    assert len(nc._subs) == before and not feed._tasks
    async with Collector(nc, s.membership("n1")) as witness:   # proof the heartbeat was delivered
        await nc.publish(s.membership("n1"), encode(heartbeat()))
        await asyncio.wait_for(witness.event.wait(), 5)
    assert feed.nodes == {}


async def test_pools_and_their_targets_are_forgotten_as_nodes_are(nc, prefix):
    """A long-running dashboard sees pools come and go (functions deployed and deleted, nodes
    replaced): what it keeps of them ends with the history, as a node's track does."""
    now = [100.0]
    s = Subjects(prefix)
    feed = DashboardFeed(nc, s, history_s=60.0, clock=lambda: now[0])

    class Msg:
        def __init__(self, subject: str, data: bytes) -> None:
            self.subject, self.data = subject, data
    for i in range(3):
        await feed._on_telemetry(Msg(s.telemetry("n1", f"p{i}"), encode(telemetry(pool=f"p{i}"))))
        await feed._on_scale(Msg(s.scale("n1", f"p{i}"), encode(ScaleCommand(node="n1", pool=f"p{i}", target_workers=2))))
    now[0] += 50.0
    await feed._on_telemetry(Msg(s.telemetry("n1", "p0"), encode(telemetry(pool="p0"))))
    await feed._on_scale(Msg(s.scale("n1", "p0"), encode(ScaleCommand(node="n1", pool="p0", target_workers=3))))
    now[0] += 20.0
    feed._prune(now[0])
    assert list(feed.pools) == [("n1", "p0")] and list(feed.targets) == [("n1", "p0")]
    await feed._on_scale(Msg(s.scale("n1", "p0"), encode(ScaleCommand(node="n1", pool="p0", target_workers=4))))
    assert orjson.loads(feed.history[-1][1])["data"]["previous"] == 3
