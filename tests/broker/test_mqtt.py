"""Devices over MQTT, the same topics and payloads both ways: nats-server's own MQTT
listener, and Mosquitto + the p2pfaas MQTT bridge (real brokers, real clients)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading

import orjson
import paho.mqtt.client as mqtt
import pytest

from broker.mqtt_bridge import MqttBridge


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
