"""The MQTT bridge: Mosquitto (devices) <-> NATS/JetStream, with nats-server's MQTT topics. A request is acked
to Mosquitto only once stored; answers come from a durable consumer, acked once Mosquitto took them;
refusals go to the reject topic. paho's thread hands messages to asyncio only in ``_on_message``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from datetime import datetime, timezone

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, ConnectionDrainingError, NoRespondersError, OutboundBufferLimitError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.errors import Error as JetStreamError
from prometheus_client import CollectorRegistry, Counter

from broker import codes
from broker import headers as H
from broker.answers import input_limit
from broker.codec import encode
from broker.errors import InvalidSubject, InvalidToken
from broker.lifecycle import StartStop, still_wanted
from broker.mqtt_client import default_client_id, mqtt_tls, parse_mqtt_url
from broker.messages import Rejection
from broker.settings import broker_settings
from broker.streams import ensure_shared_streams, results_stream
from broker.subjects import Subjects, from_mqtt, to_mqtt

log = logging.getLogger(__name__)

RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)   # between attempts to store a device's request
ANSWERS_CONSUMER = "mqtt-bridge"      # shared by every bridge of a prefix
ANSWER_FETCH_S = 1.0     # a pull waits at most this long (and a stop for the last one)
ANSWER_BATCH = 64
SESSION_EXPIRY_S = 7 * 24 * 3600   # how long Mosquitto keeps the bridge's queue while it is away
# the NATS client is closing: a request is left unacknowledged, for Mosquitto to send again later
CLOSING = (ConnectionClosedError, ConnectionDrainingError)


def _topic_of(message: mqtt.MQTTMessage) -> str:
    """A message's topic, even one that is not UTF-8 (to log and refuse it, not to fail on it)."""
    return message._topic.decode("utf-8", "replace")


class MqttBridge(StartStop):
    def __init__(self, nc: Client, mqtt_url: str, *, prefix: str = "faas", client_id: str | None = None,
                 max_payload_bytes: int = 1024 * 1024, credentials: tuple[str, str] | None = None) -> None:
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
        self._published: dict[int, asyncio.Future] = {}   # answers handed to Mosquitto, by message id
        self._tasks: list[asyncio.Task] = []
        self._answers: asyncio.Task | None = None
        self._answers_sub = None
        self._stopping = asyncio.Event()
        # MQTT v5: a request's retain flag seen as published; retained ones not replayed on resubscribing
        self._mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or default_client_id(prefix),
                                 protocol=mqtt.MQTTv5)
        self._mqtt.manual_ack_set(True)
        if credentials:
            self._mqtt.username_pw_set(*credentials)
        mqtt_tls(self._mqtt, mqtt_url, broker_settings().tls_ca)
        self._mqtt.max_inflight_messages_set(200)
        self._mqtt.reconnect_delay_set(min_delay=0.1, max_delay=2)   # back at once when Mosquitto returns
        self._mqtt.on_connect = self._on_connect
        self._mqtt.on_disconnect = self._on_disconnect
        self._mqtt.on_message = self._on_message
        self._mqtt.on_publish = self._on_publish

    # -- paho thread -> asyncio ---------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("MQTT bridge: connect refused: %s", reason_code)
            return
        client.subscribe(f"{self.subjects.prefix}/+/request/#",
                         options=SubscribeOptions(qos=1, retainAsPublished=True,
                                                  retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND))
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.connected.set)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        log.info("MQTT bridge: disconnected (%s)", reason_code)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.connected.clear)

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._inbox.put_nowait, message)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._published_done, mid)

    def _published_done(self, mid: int) -> None:
        fut = self._published.pop(mid, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    # -- lifecycle ----------------------------------------------------------------
    async def start(self, timeout_s: float = 10.0) -> "MqttBridge":
        self._loop = asyncio.get_running_loop()
        session = Properties(PacketTypes.CONNECT)
        session.SessionExpiryInterval = SESSION_EXPIRY_S   # a persistent session: Mosquitto queues for us meanwhile
        self._mqtt.connect_async(self.host, self.port, keepalive=30, clean_start=False, properties=session)
        self._mqtt.loop_start()
        async with asyncio.timeout(timeout_s):
            await self.connected.wait()
        self._answers_sub = await self._answers_consumer()
        self._answers = asyncio.create_task(self._deliver_answers(self._answers_sub), name="mqtt-bridge-answers")
        self._tasks += [asyncio.create_task(self._pump(), name="mqtt-bridge"), self._answers]
        return self

    async def stop(self) -> None:
        # answers first, gracefully: a cancelled pull's answers would be held back until their ack wait
        self._stopping.set()
        if self._answers is not None:
            await asyncio.wait([self._answers], timeout=ANSWER_FETCH_S + 2.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._answers_sub is not None:
            with contextlib.suppress(Exception):   # the connection may be gone already
                await self._answers_sub.unsubscribe()
        self._mqtt.disconnect()
        await asyncio.to_thread(self._mqtt.loop_stop)

    # -- device -> NATS -----------------------------------------------------------
    async def _pump(self) -> None:
        while True:
            still_wanted()
            message = await self._inbox.get()
            try:
                await self._to_nats(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let one message stop the bridge, nor leave its device waiting
                await self._failed(message, exc)

    async def _failed(self, message: mqtt.MQTTMessage, exc: Exception) -> None:
        """Refuse (500) and ack a request the bridge failed on (unacked, Mosquitto resends it only to a new
        connection: its device would wait for ever); stored like every answer, else sent to the device."""
        topic = _topic_of(message)
        if isinstance(exc, CLOSING):
            log.warning("MQTT bridge: request on %s not stored, the NATS connection is closing (%r); "
                        "Mosquitto sends it again to the bridge's next connection", topic, exc)
            self.messages.labels("to_nats", "left_for_redelivery").inc()
            return
        log.error("MQTT bridge: failed on the request on %s; refused 500 (send it again)", topic, exc_info=exc)
        reason = f"the MQTT bridge failed on this request ({type(exc).__name__}: {exc}); send it again"
        try:
            await self._reject_raw(topic, 500, reason)
        except asyncio.CancelledError:
            raise
        except Exception as again:
            log.error("MQTT bridge: refusal of %s not stored (%r); publishing it to the device directly", topic, again)
            if not self._reject_direct(topic, reason):
                # no MQTT connection: unacknowledged, Mosquitto sends it again when the bridge is back
                self.messages.labels("to_nats", "left_for_redelivery").inc()
                return
        self._ack(message, "failed")

    def _reject_direct(self, topic: str, reason: str) -> bool:
        """Publish a 500 refusal straight to Mosquitto (not through JetStream); False: not connected."""
        ids = self.subjects.salvage_reply_to(".".join(topic.split("/")))
        client, req = ids or ("invalid", "invalid")
        parts = topic.split("/")
        rejection = Rejection(request_id=req, client=client, fn=(parts[3][:64] if len(parts) > 3 else "") or "?",
                              code=codes.for_status(500), http_status=500, reason=reason, node="mqtt-bridge")
        subject = self.subjects.reject(client, req) if ids else self.subjects.invalid()
        info = self._mqtt.publish(to_mqtt(subject), encode(rejection), qos=1)
        return info.rc == mqtt.MQTT_ERR_SUCCESS

    async def _to_nats(self, message: mqtt.MQTTMessage) -> None:
        topic = message.topic
        try:
            subject = from_mqtt(topic)
            inv = self.subjects.parse_invocation(subject)
        except (InvalidSubject, InvalidToken) as exc:
            await self._reject_raw(topic, 400, f"malformed topic {topic!r}: {exc}")
            return self._ack(message, "invalid")
        if message.retain and not message.payload:
            # the clearing of a retained request (ours, below, comes back with retain-as-published):
            # answering it would clear it again, and broker and bridge would ping-pong for ever
            return self._ack(message, "retain_cleared")
        if message.retain:
            # a retained request would run again for every new session: refuse it, and clear it
            self._mqtt.publish(topic, b"", qos=1, retain=True)
            await self._reject(inv.client, inv.request_id, inv.fn, 400,
                               "retained requests are refused (publish requests with retain off)")
            return self._ack(message, "retained")
        # nats-server counts headers in its max_payload and closes a connection that sends more
        limit = input_limit(self.nc.max_payload, self.max_payload_bytes)
        if len(message.payload) > limit:
            await self._reject(inv.client, inv.request_id, inv.fn, 413,
                               f"payload of {len(message.payload)} bytes exceeds the limit of {limit}")
            return self._ack(message, "too_large")
        if inv.kind != "request":
            await self._reject(inv.client, inv.request_id, inv.fn, 400, f"devices publish requests, not {inv.kind}s: {topic!r}")
            return self._ack(message, "invalid")
        headers = {H.MSG_ID: inv.call_key, H.SENT_AT: repr(time.time())}
        await self._store(self.subjects.async_request(inv.node, inv.fn, inv.client, inv.request_id),
                          message.payload, headers)
        self._ack(message, "ok")

    async def _store(self, subject: str, data: bytes, headers: dict[str, str] | None = None,
                     stream: str | None = None) -> None:
        """Store on JetStream, retrying while it is down; the device's message stays unacknowledged."""
        for attempt in itertools.count():
            try:
                await self.js.publish(subject, data, headers=headers, timeout=5.0, stream=stream)
                return
            except (NatsTimeout, asyncio.TimeoutError, NoRespondersError, JetStreamError, OutboundBufferLimitError) as exc:
                delay = RETRY_S[min(attempt, len(RETRY_S) - 1)]
                log.warning("MQTT bridge: JetStream did not store %s (%s); retrying in %g s", subject, exc, delay)
                self.messages.labels("to_nats", "retried").inc()
                await asyncio.sleep(delay)

    def _ack(self, message: mqtt.MQTTMessage, outcome: str) -> None:
        self.messages.labels("to_nats", outcome).inc()
        if message.qos > 0:
            self._mqtt.ack(message.mid, message.qos)

    async def _reject(self, client: str, req: str, fn: str, status: int, reason: str) -> None:
        log.warning("MQTT bridge refused %s/%s: %s", client, req, reason)
        rejection = Rejection(request_id=req, client=client, fn=fn, code=codes.for_status(status), http_status=status,
                              reason=reason, node="mqtt-bridge")
        await self._store(self.subjects.reject(client, req), encode(rejection),
                          {H.MSG_ID: f"answer.{client}.{req}"}, results_stream(self.subjects))

    async def _reject_raw(self, topic: str, status: int, reason: str) -> None:
        parts = topic.split("/")
        ids = self.subjects.salvage_reply_to(".".join(parts)) if len(parts) == 6 else None
        if ids:
            return await self._reject(ids[0], ids[1], parts[3][:64] or "?", status, reason)
        log.warning("MQTT bridge refused %r: %s", topic, reason)
        rejection = Rejection(request_id="invalid", client="invalid", fn="?", code=codes.for_status(status), http_status=status,
                              reason=reason, node="mqtt-bridge")
        await self._store(self.subjects.invalid(), encode(rejection), None, results_stream(self.subjects))

    # -- NATS -> devices ------------------------------------------------------------
    async def _answers_consumer(self, since: datetime | None = None):
        """The durable answers consumer, new at first start, remade from ``since`` if deleted."""
        stream = results_stream(self.subjects)
        await ensure_shared_streams(self.js, self.subjects)
        config = ConsumerConfig(durable_name=ANSWERS_CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0,
                                deliver_policy=DeliverPolicy.NEW, max_ack_pending=4096,
                                filter_subjects=[self.subjects.all_results(), self.subjects.all_rejects()])
        if since is not None:
            config.deliver_policy, config.opt_start_time = DeliverPolicy.BY_START_TIME, since
        try:
            await self.js.add_consumer(stream, config)
        except BadRequestError as exc:
            if exc.err_code != 10148:   # 10148: it exists already (a restart, another bridge): keep its position
                raise
        return await self.js.pull_subscribe_bind(durable=ANSWERS_CONSUMER, stream=stream)

    async def _answers_gone(self) -> bool:
        """Whether the answers consumer (or its stream) is gone: JetStream says "not found"."""
        try:
            await self.js.consumer_info(results_stream(self.subjects), ANSWERS_CONSUMER, timeout=1.0)
        except NotFoundError:
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("MQTT bridge: answers consumer lookup: %s", exc)
        return False

    async def _remake_answers(self, since: datetime):
        old, self._answers_sub = self._answers_sub, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.unsubscribe()
        self._answers_sub = await self._answers_consumer(since)
        return self._answers_sub

    async def _deliver_answers(self, sub) -> None:
        seen_at = datetime.now(timezone.utc)   # the consumer last seen working
        while not self._stopping.is_set():
            still_wanted()
            started = datetime.now(timezone.utc)
            try:
                msgs = await sub.fetch(ANSWER_BATCH, timeout=ANSWER_FETCH_S)
            except (NatsTimeout, asyncio.TimeoutError):
                seen_at = started
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # JetStream blip: try again
                if await self._answers_gone():
                    # `nats consumer rm`, `nats stream rm`, a store lost: fetching would fail for ever
                    log.warning("MQTT bridge: answers consumer %s is gone (%s); making it again", ANSWERS_CONSUMER, exc)
                    try:
                        sub = await self._remake_answers(seen_at)
                        continue
                    except asyncio.CancelledError:
                        raise
                    except Exception as again:
                        exc = again
                log.warning("MQTT bridge: answers not fetched (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            seen_at = started
            outcomes = await asyncio.gather(*(self._to_mqtt(msg) for msg in msgs), return_exceptions=True)
            for msg, outcome in zip(msgs, outcomes):
                # one failed answer (an ack the connection lost) must not end this loop silently
                if isinstance(outcome, Exception):
                    log.warning("MQTT bridge: answer on %s not handed over (%r); it comes again", msg.subject, outcome)
                    self.messages.labels("to_mqtt", "error").inc()

    async def _to_mqtt(self, msg: Msg) -> None:
        """Hand one answer to Mosquitto; acknowledged once Mosquitto took it (else it comes again)."""
        await self.connected.wait()
        fut = asyncio.get_running_loop().create_future()
        try:
            info = self._mqtt.publish(to_mqtt(msg.subject), msg.data, qos=1)
        except ValueError as exc:
            # no MQTT topic (a '+' or '#' in a token): dropped with its reason, not redelivered for ever
            log.warning("MQTT bridge: answer on %s dropped: %s", msg.subject, exc)
            self.messages.labels("to_mqtt", "not_a_topic").inc()
            return await msg.term()
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            self.messages.labels("to_mqtt", "not_sent").inc()
            return await msg.nak(delay=1.0)
        self._published[info.mid] = fut
        if info.is_published():
            self._published_done(info.mid)
        try:
            async with asyncio.timeout(20.0):
                await fut
        except asyncio.TimeoutError:
            self._published.pop(info.mid, None)
            self.messages.labels("to_mqtt", "unconfirmed").inc()
            return await msg.nak()
        self.messages.labels("to_mqtt", "ok").inc()
        await msg.ack()
