"""The MQTT bridge: Mosquitto (devices) <-> NATS/JetStream, with the same topics as
nats-server's own MQTT listener (``faas/n1/request/fib/dev1/r1`` <-> ``faas.n1.request.fib.dev1.r1``).

A device's QoS-1 request is acknowledged to Mosquitto only after JetStream
stored it (paho manual ack), so a bridge crash loses nothing: Mosquitto
redelivers to the bridge's persistent session. Results and rejections flow back
at QoS 1. paho's network thread hands messages to asyncio in one place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlparse

import paho.mqtt.client as mqtt
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import Error as JetStreamError
from prometheus_client import CollectorRegistry, Counter

from broker import headers as H
from broker.codec import encode
from broker.errors import InvalidSubject, InvalidToken
from broker.messages import Rejection
from broker.streams import results_stream
from broker.subjects import Subjects, from_mqtt, to_mqtt

log = logging.getLogger(__name__)


def parse_mqtt_url(url: str) -> tuple[str, int]:
    parsed = urlparse(url if "://" in url else f"mqtt://{url}")
    if parsed.scheme not in ("mqtt", "tcp"):
        raise ValueError(f"MQTT URL {url!r} must look like mqtt://HOST:PORT")
    return parsed.hostname or "127.0.0.1", parsed.port or 1883


class MqttBridge:
    def __init__(self, nc: Client, mqtt_url: str, *, prefix: str = "faas", client_id: str = "p2pfaas-bridge",
                 max_payload_bytes: int = 1024 * 1024) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = Subjects(prefix)
        self.host, self.port = parse_mqtt_url(mqtt_url)
        self.max_payload_bytes = max_payload_bytes
        self.connected = asyncio.Event()
        self.registry = CollectorRegistry()
        self.messages = Counter("p2pfaas_mqtt_bridge_messages", "Messages bridged", ["direction", "outcome"],
                                registry=self.registry)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: asyncio.Queue[mqtt.MQTTMessage] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._subs: list = []
        self._mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False,
                                 protocol=mqtt.MQTTv311)
        self._mqtt.manual_ack_set(True)
        self._mqtt.max_inflight_messages_set(200)
        self._mqtt.on_connect = self._on_connect
        self._mqtt.on_disconnect = self._on_disconnect
        self._mqtt.on_message = self._on_message

    # -- paho thread -> asyncio ---------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("MQTT bridge: connect refused: %s", reason_code)
            return
        client.subscribe(f"{self.subjects.prefix}/+/request/#", qos=1)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.connected.set)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        log.info("MQTT bridge: disconnected (%s)", reason_code)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.connected.clear)

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._inbox.put_nowait, message)

    # -- lifecycle ----------------------------------------------------------------
    async def start(self, timeout_s: float = 10.0) -> "MqttBridge":
        self._loop = asyncio.get_running_loop()
        self._mqtt.connect_async(self.host, self.port, keepalive=30)
        self._mqtt.loop_start()
        await asyncio.wait_for(self.connected.wait(), timeout_s)
        self._subs.append(await self.nc.subscribe(self.subjects.all_results(), cb=self._to_mqtt))
        self._subs.append(await self.nc.subscribe(self.subjects.all_rejects(), cb=self._to_mqtt))
        self._tasks.append(asyncio.create_task(self._pump(), name="mqtt-bridge"))
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in self._subs:
            await sub.unsubscribe()
        self._mqtt.disconnect()
        await asyncio.to_thread(self._mqtt.loop_stop)

    async def __aenter__(self) -> "MqttBridge":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- device -> NATS -----------------------------------------------------------
    async def _pump(self) -> None:
        while True:
            message = await self._inbox.get()
            try:
                await self._to_nats(message)
            except Exception:  # never let one message stop the bridge
                log.exception("MQTT bridge: failed on %s", message.topic)
                self.messages.labels("to_nats", "error").inc()

    async def _to_nats(self, message: mqtt.MQTTMessage) -> None:
        topic = message.topic
        try:
            subject = from_mqtt(topic)
            inv = self.subjects.parse_invocation(subject)
        except (InvalidSubject, InvalidToken) as exc:
            await self._reject_raw(topic, 400, f"malformed topic {topic!r}: {exc}")
            return self._ack(message, "invalid")
        if len(message.payload) > self.max_payload_bytes:
            await self._reject(inv.client, inv.request_id, inv.fn, 413,
                               f"payload of {len(message.payload)} bytes exceeds the limit of {self.max_payload_bytes}")
            return self._ack(message, "too_large")
        if inv.kind != "request":
            await self._reject(inv.client, inv.request_id, inv.fn, 400, f"devices publish requests, not {inv.kind}s: {topic!r}")
            return self._ack(message, "invalid")
        headers = {H.MSG_ID: inv.call_key, H.SENT_AT: repr(time.time())}
        subject = self.subjects.async_request(inv.node, inv.fn, inv.client, inv.request_id)
        try:
            await self.js.publish(subject, message.payload, headers=headers, timeout=5.0)
        except (NatsTimeout, asyncio.TimeoutError, NoRespondersError, JetStreamError) as exc:
            # not acked: Mosquitto redelivers it to our persistent session after reconnect
            log.warning("MQTT bridge: JetStream did not store %s (%s); leaving it unacknowledged", subject, exc)
            self.messages.labels("to_nats", "unstored").inc()
            return
        self._ack(message, "ok")

    def _ack(self, message: mqtt.MQTTMessage, outcome: str) -> None:
        self.messages.labels("to_nats", outcome).inc()
        if message.qos > 0:
            self._mqtt.ack(message.mid, message.qos)

    async def _reject(self, client: str, req: str, fn: str, status: int, reason: str) -> None:
        log.warning("MQTT bridge refused %s/%s: %s", client, req, reason)
        rejection = Rejection(request_id=req, client=client, fn=fn, code=status, http_status=status,
                              reason=reason, node="mqtt-bridge")
        await self.js.publish(self.subjects.reject(client, req), encode(rejection),
                              headers={H.MSG_ID: f"reject.{client}.{req}"}, stream=results_stream(self.subjects))

    async def _reject_raw(self, topic: str, status: int, reason: str) -> None:
        parts = topic.split("/")
        ids = self.subjects.salvage_reply_to(".".join(parts)) if len(parts) == 6 else None
        if ids:
            return await self._reject(ids[0], ids[1], parts[3][:64] or "?", status, reason)
        log.warning("MQTT bridge refused %r: %s", topic, reason)
        rejection = Rejection(request_id="invalid", client="invalid", fn="?", code=status, http_status=status,
                              reason=reason, node="mqtt-bridge")
        await self.js.publish(self.subjects.invalid(), encode(rejection), stream=results_stream(self.subjects))

    # -- NATS -> devices ------------------------------------------------------------
    async def _to_mqtt(self, msg: Msg) -> None:
        info = self._mqtt.publish(to_mqtt(msg.subject), msg.data, qos=1)
        self.messages.labels("to_mqtt", "ok" if info.rc == mqtt.MQTT_ERR_SUCCESS else "queued").inc()
