"""The six ways a caller reaches p2pfaas, each as the fault suite's load generator sees it:
send one call, record what comes back in a :class:`Ledger`, look up what is still missing at
the end. Direct: HTTP ``/function``, NATS request/reply. Async: HTTP ``/async-function`` +
``/result``, NATS ``FaasClient.submit``, MQTT QoS 1 through nats-server's listener or through
Mosquitto + the MQTT bridge."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import httpx
import paho.mqtt.client as mqtt
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.answers import Answer
from broker.client import FaasClient
from broker.errors import BrokerUnavailable, InvalidSubject, NodeUnavailable
from broker.streams import results_stream
from broker.subjects import Subjects, from_mqtt
from fault_suite.ledger import Ledger
from fault_suite.stack import NODE

log = logging.getLogger(__name__)

FUNCTION = "sleep"
HTTP_DIRECT, HTTP_ASYNC = "HTTP direct", "HTTP async"
NATS_DIRECT, NATS_ASYNC = "NATS direct", "NATS async"
MQTT_NATS, MQTT_MOSQUITTO = "MQTT nats-server", "MQTT Mosquitto+bridge"
ALL = (HTTP_DIRECT, HTTP_ASYNC, NATS_DIRECT, NATS_ASYNC, MQTT_NATS, MQTT_MOSQUITTO)
LATE_FROM_STREAM = "answered late: fetched from the results stream (missed while disconnected)"


class Transport:
    """One transport's load: ``send`` starts a call and returns at once (open loop)."""

    direct = False

    def __init__(self, name: str, client: str) -> None:
        self.name, self.client = name, client   # client: the <client> token of this transport's calls
        self.ledger = Ledger(name, self.direct)
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        pass

    def send(self, req: str, payload: bytes, phase: str) -> None:
        self.ledger.sent(req, phase)
        task = asyncio.create_task(self._call(req, payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, req: str, payload: bytes) -> None:
        raise NotImplementedError

    def in_flight(self) -> int:
        return len(self._tasks)

    async def settle(self, faas: FaasClient) -> None:
        """At the end: look up what the system stored for calls still unanswered."""

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class HttpTransport(Transport):
    """A transport over the node's HTTP bridge: one client, its failures sorted (refused or silent)."""

    def __init__(self, name: str, base_url: str, client: str, timeout_s: float) -> None:
        super().__init__(name, client)
        self.http = httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=5.0),
                                      limits=httpx.Limits(max_connections=64))

    async def _post(self, req: str, path: str, payload: bytes) -> httpx.Response | None:
        """The response, or None: then the call was refused (told at once) or met silence (a
        timeout: lost unless answered otherwise)."""
        try:
            return await self.http.post(path, content=payload)
        except httpx.TimeoutException:
            return None
        except httpx.ConnectError:
            self.ledger.refused(req, "connection refused (HTTP bridge down)")
        except httpx.HTTPError as exc:
            self.ledger.refused(req, f"connection closed without an answer ({type(exc).__name__})")
        return None

    async def close(self) -> None:
        await super().close()
        await self.http.aclose()


class HttpDirect(HttpTransport):
    direct = True

    def __init__(self, base_url: str, client: str, timeout_s: float) -> None:
        super().__init__(HTTP_DIRECT, base_url, client, timeout_s)

    async def _call(self, req: str, payload: bytes) -> None:
        response = await self._post(req, f"/function/{FUNCTION}", payload)
        if response is not None:
            self.ledger.answered(req, response.status_code, response.content)


class HttpAsync(HttpTransport):
    """``POST /async-function`` (202 = accepted), then ``GET /result/{id}`` until answered."""

    POLL_S = 0.5

    def __init__(self, base_url: str, client: str, timeout_s: float) -> None:
        super().__init__(HTTP_ASYNC, base_url, client, timeout_s)
        self.call_ids: dict[str, str] = {}   # our request id -> the bridge's call id
        self._poller: asyncio.Task | None = None

    async def start(self) -> None:
        self._poller = asyncio.create_task(self._poll())

    async def _call(self, req: str, payload: bytes) -> None:
        response = await self._post(req, f"/async-function/{FUNCTION}", payload)
        if response is None:
            return
        if response.status_code == 202:
            self.call_ids[req] = response.headers["x-call-id"]
            self.ledger.accepted(req)
        else:
            self.ledger.refused(req, f"{response.status_code} {_message(response.content)}")

    async def _poll(self) -> None:
        limit = asyncio.Semaphore(8)

        async def look(req: str, call_id: str) -> None:
            async with limit:
                try:
                    response = await self.http.get(f"/result/{call_id}")
                except httpx.HTTPError:
                    return
            # 202: stored, not answered yet (any bridge process, a restarted one too, looks in
            # JetStream); 503: the bridge cannot look now. A 404 is an answer: the call is lost.
            if response.status_code not in (202, 503):
                self.ledger.answered(req, response.status_code, response.content)

        while True:
            await asyncio.sleep(self.POLL_S)
            waiting = [(req, cid) for req, cid in self.call_ids.items() if not self.ledger.calls[req].answered]
            await asyncio.gather(*(look(req, cid) for req, cid in waiting))

    def answer_keys(self) -> dict[str, str]:
        """The bridge's call ids (its answers are stored under them), by our request id."""
        return dict(self.call_ids)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await super().close()


class NatsDirect(Transport):
    direct = True

    def __init__(self, nc: Client, client: str, prefix: str, timeout_s: float) -> None:
        super().__init__(NATS_DIRECT, client)
        self.faas = FaasClient(nc, client=client, prefix=prefix)
        self.timeout_s = timeout_s

    async def start(self) -> None:
        await self.faas.start()

    async def _call(self, req: str, payload: bytes) -> None:
        try:
            answer = await self.faas.invoke(NODE, FUNCTION, payload, req=req, timeout_s=self.timeout_s)
        except NodeUnavailable as exc:
            if str(exc).startswith("not connected"):
                self.ledger.refused(req, "client not connected to NATS")
            else:   # no responders / the node went away: the system's own fast 503
                self.ledger.answered(req, 503, str(exc).encode())
            return
        except asyncio.TimeoutError:
            return   # silence: lost
        self.ledger.answered(req, answer.status, answer.body)

    async def close(self) -> None:
        await super().close()
        await self.faas.stop()


class NatsAsync(Transport):
    """``FaasClient.submit`` (the JetStream PubAck = accepted); every answer delivered on the
    client's result/reject subjects is recorded (a second, different one is a duplicate)."""

    def __init__(self, nc: Client, client: str, prefix: str) -> None:
        super().__init__(NATS_ASYNC, client)
        self.nc, self.subjects = nc, Subjects(prefix)
        self.faas = FaasClient(nc, client=client, prefix=prefix)
        self._subs: list = []

    async def start(self) -> None:
        for subject in (self.subjects.results_of(self.client), self.subjects.rejects_of(self.client)):
            self._subs.append(await self.nc.subscribe(subject, cb=self._on_answer))

    async def _on_answer(self, msg: Msg) -> None:
        record_answer(self.ledger, self.subjects, msg.subject, msg.data)

    async def _call(self, req: str, payload: bytes) -> None:
        try:
            await self.faas.submit(NODE, FUNCTION, payload, req)
        except Exception as exc:   # whatever it is, the caller was told: not stored
            self.ledger.refused(req, f"submit failed: {type(exc).__name__} {_message(str(exc).encode())}")
            return
        self.ledger.accepted(req)

    async def settle(self, faas: FaasClient) -> None:
        for req in self.ledger.pending():
            answer = await _stored(faas, self.client, req)
            if answer is not None:
                call = self.ledger.calls[req]
                call.late = LATE_FROM_STREAM
                self.ledger.answered(req, answer.status, answer.body)

    async def close(self) -> None:
        await super().close()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:   # the connection may be gone
                pass


class MqttDevice(Transport):
    """A device: QoS 1 requests (PUBACK = accepted), QoS 1 subscriptions to its results and
    rejects, a persistent session (clean_session false) that survives broker restarts."""

    def __init__(self, name: str, host: str, port: int, client: str, prefix: str, credentials: tuple[str, str]) -> None:
        super().__init__(name, client)
        self.subjects, self.prefix = Subjects(prefix), prefix
        self.host, self.port = host, port
        self.mids: dict[int, str] = {}
        self.subscribed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{client}-device",
                                clean_session=False, protocol=mqtt.MQTTv311)
        self.mqtt.username_pw_set(*credentials)   # a new identity: up reloads the brokers within ~1 s,
        self.mqtt.reconnect_delay_set(0.2, 2.0)    # a refused first connect is tried again
        self.mqtt.max_inflight_messages_set(100)
        self.mqtt.on_connect = self._on_connect
        self.mqtt.on_subscribe = self._on_subscribe
        self.mqtt.on_publish = self._on_publish
        self.mqtt.on_message = self._on_message

    # paho's network thread: hand everything to the event loop
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if not reason_code.is_failure:
            client.subscribe([(f"{self.prefix}/result/{self.client}/#", 1), (f"{self.prefix}/reject/{self.client}/#", 1)])

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        if all(not rc.is_failure for rc in reason_codes):
            self._loop.call_soon_threadsafe(self.subscribed.set)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self._loop.call_soon_threadsafe(self._acked, mid)

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        self._loop.call_soon_threadsafe(record_answer, self.ledger, self.subjects, from_mqtt(message.topic),
                                        message.payload)

    def _acked(self, mid: int) -> None:
        req = self.mids.pop(mid, None)
        if req is not None:
            self.ledger.accepted(req)

    async def start(self, timeout_s: float = 30.0) -> None:
        self._loop = asyncio.get_running_loop()
        self.mqtt.connect_async(self.host, self.port, keepalive=10)
        self.mqtt.loop_start()
        try:
            await asyncio.wait_for(self.subscribed.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise BrokerUnavailable(f"{self.name}: no MQTT subscription on {self.host}:{self.port} within {timeout_s:g} s") from None

    def send(self, req: str, payload: bytes, phase: str) -> None:
        self.ledger.sent(req, phase)
        info = self.mqtt.publish(f"{self.prefix}/{NODE}/request/{FUNCTION}/{self.client}/{req}", payload, qos=1)
        if info.rc in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):   # NO_CONN: queued, sent on reconnect
            self.mids[info.mid] = req
        else:
            self.ledger.refused(req, f"paho refused the publish ({mqtt.error_string(info.rc)})")

    def in_flight(self) -> int:
        return len(self.mids)

    async def settle(self, faas: FaasClient) -> None:
        """A device has no way to fetch a missed answer: only say whether the system stored it."""
        for req in self.ledger.pending():
            if await _stored(faas, self.client, req) is not None:
                self.ledger.unanswered_but_stored.add(req)

    async def close(self) -> None:
        self.mqtt.disconnect()
        await asyncio.to_thread(self.mqtt.loop_stop)


def record_answer(ledger: Ledger, subjects: Subjects, subject: str, data: bytes) -> None:
    try:
        kind, _, req = subjects.answer_ids(subject)
        answer = Answer.of_stored(kind, data)
    except Exception as exc:   # an unreadable answer is an answer too: say so
        log.warning("unreadable answer on %s: %s", subject, exc)
        try:
            req = subject.rsplit(".", 1)[1]
        except IndexError:
            return
        ledger.answered(req, 0, data, f"unreadable answer: {exc}".encode())
        return
    ledger.answered(req, answer.status, data, answer.body)


async def _stored(faas: FaasClient, client: str, req: str) -> Answer | None:
    try:
        return await faas.stored_answer(client, req)
    except Exception as exc:   # JetStream unavailable: nothing found
        log.warning("stored answer of %s/%s: %s", client, req, exc)
        return None


async def stored_answer_counts(nc: Client, prefix: str, client: str) -> Counter[str]:
    """How many answers (results + rejections) the results stream keeps per request id of
    ``client``: more than one is a duplicate that JetStream's dedup did not catch."""
    subjects = Subjects(prefix)
    info = await nc.jetstream().stream_info(results_stream(subjects), subjects_filter=f"{prefix}.*.{client}.*")
    counts: Counter[str] = Counter()
    for subject, n in (info.state.subjects or {}).items():
        try:
            _, _, req = subjects.answer_ids(subject)
        except InvalidSubject:
            continue
        counts[req] += n
    return counts


def _message(body: bytes) -> str:
    import orjson

    try:
        data = orjson.loads(body)
        return str(data.get("message", data))[:120] if isinstance(data, dict) else str(data)[:120]
    except orjson.JSONDecodeError:
        return body[:120].decode(errors="replace")
