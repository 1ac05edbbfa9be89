"""Devices over MQTT, the same topics and payloads both ways: nats-server's own MQTT
listener, and Mosquitto + the p2pfaas MQTT bridge (real brokers, real clients)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading

import orjson
import paho.mqtt.client as mqtt
import pytest
from nats.errors import ConnectionClosedError

from broker.connection import close_quietly, connect
from broker.embedded import NatsServer
from broker.mqtt_bridge import ANSWERS_CONSUMER, MqttBridge
from broker.streams import results_stream
from broker.subjects import Subjects
from nodes.node import Node
from nodes.settings import NodeSettings
from support import wait_until


@pytest.fixture(params=["nats-mqtt-listener", "mosquitto+bridge"])
async def mqtt_port(request, nats_server, mosquitto, nc, prefix):
    if request.param == "nats-mqtt-listener":
        yield nats_server.mqtt_port
        return
    async with MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}", max_payload_bytes=1000):
        yield mosquitto.port


class Device:
    """A paho device: subscribes to its answers, publishes requests at QoS 1."""

    def __init__(self, port: int, prefix: str, client: str = "dev1") -> None:
        self.prefix, self.client = prefix, client
        self.answers: dict[str, dict] = {}
        self.got = threading.Condition()
        self.paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{client}-{prefix}")
        subscribed = threading.Event()
        self.paho.on_subscribe = lambda *a: subscribed.set()
        self.paho.on_message = self._on_message
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()
        self.paho.subscribe([(f"{prefix}/result/{client}/#", 1), (f"{prefix}/reject/#", 1)])
        assert subscribed.wait(10)

    def _on_message(self, client, userdata, msg) -> None:
        with self.got:
            self.answers[msg.topic] = orjson.loads(msg.payload)
            self.got.notify_all()

    def publish(self, topic_tail: str, payload: bytes) -> None:
        self.paho.publish(f"{self.prefix}/{topic_tail}", payload, qos=1).wait_for_publish(10)

    async def answer(self, topic_tail: str, timeout_s: float = 20.0) -> dict:
        topic = f"{self.prefix}/{topic_tail}"

        def wait() -> dict:
            with self.got:
                assert self.got.wait_for(lambda: topic in self.answers, timeout_s), f"nothing on {topic}"
                return self.answers[topic]
        return await asyncio.to_thread(wait)

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


@contextlib.contextmanager
def device(port: int, prefix: str):
    d = Device(port, prefix)
    try:
        yield d
    finally:
        d.close()


async def test_device_request_gets_result_on_result_topic(node_factory, mqtt_port, prefix):
    async with node_factory(max_payload_bytes=1000):
        with device(mqtt_port, prefix) as dev:
            dev.publish("n1/request/fib/dev1/r1", b"25")
            result = await dev.answer("result/dev1/r1")
    assert result["status"] == 200 and result["output"] == "75025" and result["executed_by"] == "n1"


async def test_device_bad_input_gets_rejections(node_factory, mqtt_port, prefix):
    async with node_factory(max_payload_bytes=1000):
        with device(mqtt_port, prefix) as dev:
            dev.publish("n1/request/nope/dev1/r2", b"1")
            dev.publish("n1/request/echo/dev1/r3", b"x" * 1001)
            dev.publish("n1/request/f$n/dev1/r4", b"1")
            dev.publish("n1/request/fib/dev1/r5", b"10")
            assert (await dev.answer("reject/dev1/r2"))["code"] == 3     # P2PFaaS: not found
            assert (await dev.answer("reject/dev1/r3"))["code"] == 4     # input not valid (too large)
            assert "malformed" in (await dev.answer("reject/dev1/r4"))["reason"]
            assert (await dev.answer("result/dev1/r5"))["output"] == "55"  # still serving


async def test_request_topics_of_another_shape_are_rejected_not_lost(node_factory, mqtt_port, prefix):
    """A level short or one too many: no client and request id can be read off such a topic, so
    the rejection goes to <prefix>/reject/invalid (logged and counted), through nats-server's
    MQTT listener as through Mosquitto and the bridge."""
    async with node_factory():
        with device(mqtt_port, prefix) as dev:
            dev.publish("n1/request/fib/dev1", b"1")          # a level short
            first = await dev.answer("reject/invalid")
            dev.answers.clear()
            dev.publish("n1/request/fib/dev1/r1/extra", b"1")  # a level too many
            second = await dev.answer("reject/invalid")
            dev.publish("n1/request/fib/dev1/r2", b"20")       # and a good one still runs
            result = await dev.answer("result/dev1/r2")
    assert first["code"] == 4 and second["code"] == 4 and first["reason"] and second["reason"]
    assert result["output"] == "6765"


async def test_mosquitto_clients_like_the_readme(node_factory, mqtt_port, prefix):
    if shutil.which("mosquitto_pub") is None:
        pytest.fail("mosquitto-clients not installed: apt-get install -y mosquitto-clients (.ci/run does this)")
    async with node_factory():
        sub = await asyncio.create_subprocess_exec(
            "stdbuf", "-oL", "mosquitto_sub", "-p", str(mqtt_port), "-q", "1", "-t", f"{prefix}/result/dev1/#", "-C", "1", "-W", "30", "-d",
            stdout=asyncio.subprocess.PIPE)
        assert sub.stdout is not None
        for _ in range(50):   # its debug lines until the SUBACK (bounded: a dead mosquitto_sub fails here)
            line = await asyncio.wait_for(sub.stdout.readline(), 10)
            assert line, f"mosquitto_sub ended before its SUBACK (exit {await sub.wait()})"
            if b"SUBACK" in line:
                break
        else:
            pytest.fail("no SUBACK in mosquitto_sub's first 50 lines")
        pub = await asyncio.create_subprocess_exec(
            "mosquitto_pub", "-p", str(mqtt_port), "-q", "1", "-t", f"{prefix}/n1/request/fib/dev1/r1", "-m", "25")
        assert await asyncio.wait_for(pub.wait(), 10) == 0
        out, _ = await asyncio.wait_for(sub.communicate(), 30)
    payload = next(line for line in out.splitlines() if line.startswith(b"{"))
    assert orjson.loads(payload)["output"] == "75025"


async def test_request_to_a_node_that_never_existed_is_refused_not_kept_forever(node_factory, mqtt_port, prefix):
    async with node_factory(unknown_node_after_s=1.0):
        with device(mqtt_port, prefix) as dev:
            dev.publish("result/request/echo/dev1/lost0", b"x")   # a name no node can have (reserved)
            dev.publish("nosuchnode/request/echo/dev1/lost1", b"x")
            reserved = await dev.answer("reject/dev1/lost0", timeout_s=30)
            rejection = await dev.answer("reject/dev1/lost1", timeout_s=30)
            dev.publish("n1/request/echo/dev1/fine", b"x")        # and the node itself still serves
            result = await dev.answer("result/dev1/fine")
    assert rejection["http_status"] == 404 and rejection["code"] == 3 and "never been started" in rejection["reason"]
    assert reserved["http_status"] in (400, 404) and "reserved" in reserved["reason"], reserved
    assert result["output"] == "x"


async def test_answers_produced_while_the_bridge_is_down_reach_the_device(node_factory, mosquitto, nc, prefix):
    async with node_factory():
        with device(mosquitto.port, prefix) as dev:
            bridge = MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}")
            async with bridge:
                dev.publish("n1/request/echo/dev1/before", b"1")
                await dev.answer("result/dev1/before")
            dev.publish("n1/request/fib/dev1/during", b"20")     # the bridge is down: Mosquitto keeps it
            async with MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}"):
                result = await dev.answer("result/dev1/during", timeout_s=30)
    assert result["output"] == "6765"


async def test_retained_requests_are_refused(node_factory, mosquitto, nc, prefix):
    async with node_factory(), MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}") as bridge:
        with device(mosquitto.port, prefix) as dev:
            dev.paho.publish(f"{prefix}/n1/request/echo/dev1/kept", b"x", qos=1, retain=True).wait_for_publish(10)
            rejection = await dev.answer("reject/dev1/kept")
            await asyncio.sleep(1.0)   # the bridge's clearing comes back to it: once, not in a loop
        seen = {outcome: bridge.messages.labels("to_nats", outcome)._value.get() for outcome in ("retained", "retain_cleared")}
    assert rejection["http_status"] == 400 and "retained" in rejection["reason"]
    assert seen == {"retained": 1, "retain_cleared": 1}


async def test_two_bridges_side_by_side_answer_each_request_once(node_factory, mosquitto, nc, prefix):
    async with node_factory(k=4), \
            MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"a-{prefix}"), \
            MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"b-{prefix}"):
        with device(mosquitto.port, prefix) as dev:
            seen: list[str] = []
            original = dev._on_message

            def count(client, userdata, msg):
                seen.append(msg.topic)
                original(client, userdata, msg)
            dev.paho.on_message = count
            for i in range(10):
                dev.publish(f"n1/request/echo/dev1/twice{i}", b"x")
            for i in range(10):
                await dev.answer(f"result/dev1/twice{i}")
            await asyncio.sleep(1.0)   # the window in which a duplicate would arrive
    assert sorted(t for t in seen if "twice" in t) == sorted(f"{prefix}/result/dev1/twice{i}" for i in range(10))


async def test_an_answer_mosquitto_cannot_take_does_not_stop_the_answers(node_factory, mosquitto, nc, prefix):
    """A stored answer whose subject is no MQTT topic (a wildcard in a token, from a publisher that
    does not check its tokens) is dropped with a reason; the answers after it still reach devices."""
    async with node_factory(), MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}") as bridge:
        with device(mosquitto.port, prefix) as dev:
            await nc.jetstream().publish(f"{prefix}.result.dev1.bad+id", b'{"x": 1}')
            await asyncio.sleep(0.5)
            dev.publish("n1/request/echo/dev1/after", b"1")
            result = await dev.answer("result/dev1/after", timeout_s=10)
        dropped = bridge.messages.labels("to_mqtt", "not_a_topic")._value.get()
    assert result["output"] == "1" and dropped == 1


async def test_an_answer_that_fails_to_go_out_is_retried_not_the_end_of_the_answers(node_factory, mosquitto, nc, prefix):
    async with node_factory(), MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}") as bridge:
        handover, failed = bridge._to_mqtt, []

        async def fails_once(msg):   # as an ack whose connection just went away
            if not failed:
                failed.append(msg.subject)
                await msg.nak()
                raise ConnectionError("connection lost mid-ack")
            await handover(msg)
        bridge._to_mqtt = fails_once
        with device(mosquitto.port, prefix) as dev:
            dev.publish("n1/request/echo/dev1/first", b"1")
            first = await dev.answer("result/dev1/first", timeout_s=10)
            dev.publish("n1/request/echo/dev1/second", b"2")
            second = await dev.answer("result/dev1/second", timeout_s=10)
    assert failed and first["output"] == "1" and second["output"] == "2"


def _answers_to(dev: Device, req: str) -> list[str]:
    return [t for t in dev.answers if t.endswith(f"/dev1/{req}")]


async def test_a_request_the_bridge_fails_on_unexpectedly_gets_one_refusal_and_the_next_ones_run(
        node_factory, mosquitto, nc, prefix, caplog):
    """An error the bridge does not expect while storing a request (a bug, an unexpected broker
    error): the request used to stay unacknowledged and unanswered, its device waiting for ever
    (Mosquitto resends only to a new connection). Now it is refused 500, logged and counted, and
    acknowledged; the requests after it are served."""
    async with node_factory(), MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}") as bridge:
        store, failed = bridge._store, []

        async def fails_once(subject, *args, **kwargs):   # as a bug hit by one request
            if ".async." in subject and not failed:
                failed.append(subject)
                raise RuntimeError("injected failure")
            await store(subject, *args, **kwargs)
        bridge._store = fails_once
        with device(mosquitto.port, prefix) as dev:
            dev.publish("n1/request/echo/dev1/hit", b"1")
            refused = await dev.answer("reject/dev1/hit", timeout_s=10)
            for i in range(3):
                dev.publish(f"n1/request/echo/dev1/next{i}", b"2")
            later = [await dev.answer(f"result/dev1/next{i}", timeout_s=10) for i in range(3)]
            await asyncio.sleep(1.0)   # the window in which a second answer to "hit" would arrive
            answered = _answers_to(dev, "hit")
        counted = bridge.messages.labels("to_nats", "failed")._value.get()
    assert failed and refused["http_status"] == 500 and "injected failure" in refused["reason"]
    assert answered == [f"{prefix}/reject/dev1/hit"] and [a["output"] for a in later] == ["2"] * 3
    assert counted == 1
    assert [r for r in caplog.records if "refused 500" in r.getMessage()]


async def test_a_refusal_that_cannot_be_stored_either_goes_straight_to_the_device(node_factory, mosquitto, nc, prefix):
    """The unexpected error hits the refusal's store too: the refusal is published straight to
    the device on its reject topic, and the request acknowledged (not left holding a slot)."""
    async with node_factory(), MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}") as bridge:
        store, broken = bridge._store, [True]

        async def fails(subject, *args, **kwargs):
            if broken[0]:
                raise RuntimeError("injected failure")
            await store(subject, *args, **kwargs)
        bridge._store = fails
        with device(mosquitto.port, prefix) as dev:
            dev.publish("n1/request/echo/dev1/hit", b"1")
            refused = await dev.answer("reject/dev1/hit", timeout_s=10)
            broken[0] = False
            dev.publish("n1/request/echo/dev1/after", b"2")
            later = await dev.answer("result/dev1/after", timeout_s=10)
            await asyncio.sleep(1.0)
            answered = _answers_to(dev, "hit")
    assert refused["http_status"] == 500 and answered == [f"{prefix}/reject/dev1/hit"] and later["output"] == "2"


async def test_a_request_caught_by_the_bridges_shutdown_is_sent_again_to_its_next_connection(
        node_factory, mosquitto, nc, prefix):
    """The NATS connection closing under a request (the bridge being stopped): not refused, but
    left unacknowledged, and Mosquitto sends it again to the bridge's next connection (its
    persistent session): one answer, the result."""
    async with node_factory():
        with device(mosquitto.port, prefix) as dev:
            async with MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}") as bridge:
                store = bridge._store

                async def closing(subject, *args, **kwargs):
                    if ".async." in subject:
                        raise ConnectionClosedError
                    await store(subject, *args, **kwargs)
                bridge._store = closing
                dev.publish("n1/request/echo/dev1/caught", b"1")
                await wait_until(lambda: bridge.messages.labels("to_nats", "left_for_redelivery")._value.get() == 1,
                                 timeout_s=10)
            assert not _answers_to(dev, "caught")
            async with MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}"):
                result = await dev.answer("result/dev1/caught", timeout_s=20)
                await asyncio.sleep(1.0)
                answered = _answers_to(dev, "caught")
    assert result["output"] == "1" and answered == [f"{prefix}/result/dev1/caught"]


@pytest.mark.parametrize("deleted", ["answers stream", "answers consumer"])
async def test_answers_reach_devices_again_after_their_stream_or_consumer_is_deleted(
        node_factory, mosquitto, nc, prefix, caplog, deleted):
    """``nats stream rm <PREFIX>_RESULTS`` (or ``nats consumer rm`` of the bridge's consumer) under
    a running bridge: its fetches failed for ever (a warning every 0.5 s) and no device got an
    answer again until a restart; with the stream gone, the nodes could not even store answers.
    Now the bridge makes them again, from when its consumer was last seen working."""
    s, js = Subjects(prefix), nc.jetstream()
    caplog.set_level(logging.WARNING, logger="broker.mqtt_bridge")
    async with node_factory(), MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}"):
        with device(mosquitto.port, prefix) as dev:
            dev.publish("n1/request/echo/dev1/before", b"1")
            await dev.answer("result/dev1/before", timeout_s=10)
            if deleted == "answers stream":
                await js.delete_stream(results_stream(s))
            else:
                await js.delete_consumer(results_stream(s), ANSWERS_CONSUMER)
            dev.publish("n1/request/echo/dev1/after", b"2")
            result = await dev.answer("result/dev1/after", timeout_s=15)
    assert result["output"] == "2"
    remade = [r for r in caplog.records if "is gone" in r.getMessage() and "making it again" in r.getMessage()]
    assert len(remade) == 1, [r.getMessage() for r in caplog.records]


async def test_a_payload_over_the_nats_servers_limit_is_refused_413_not_retried_for_ever(mosquitto, prefix, tmp_path):
    """A payload within the bridge's limit but over the NATS server's max_payload once the
    request's headers are counted: nats-server closed the bridge's connection on each store, the
    store was retried for ever, and no device was served again. Now it is refused 413."""
    server = NatsServer(data_dir=tmp_path / "nats", port=None, max_payload=256 * 1024)
    await server.start()
    node = nc = None
    try:
        node = await Node(NodeSettings(node_id="n1", nats_url=server.url, prefix=prefix, data_dir=tmp_path / "node",
                                       learner=False, runtime="inprocess")).start()
        assert node.pool is not None
        await node.pool.wait_ready(30)
        nc = await connect(server.url, "bridge")
        async with MqttBridge(nc, mosquitto.url, prefix=prefix, client_id=f"bridge-{prefix}"):
            with device(mosquitto.port, prefix) as dev:
                dev.publish("n1/request/echo/dev1/big", b"x" * (256 * 1024))   # exactly max_payload
                refused = await dev.answer("reject/dev1/big", timeout_s=10)
                dev.publish("n1/request/echo/dev1/small", b"ok")
                result = await dev.answer("result/dev1/small", timeout_s=20)
    finally:
        if nc is not None:
            await close_quietly(nc)
        if node is not None:
            await node.stop()
        await server.stop()
    assert refused["http_status"] == 413 and "exceeds the limit" in refused["reason"] and result["output"] == "ok"
