"""Client side of ``p2pfaas invoke``: call a function over HTTP, MQTT or NATS."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
import paho.mqtt.client as mqtt

from broker.client import Answer, FaasClient
from broker.connection import connect
from broker.mqtt_client import mqtt_tls, parse_mqtt_url
from broker.settings import broker_settings
from broker.subjects import Subjects, from_mqtt


@dataclass
class Outcome:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0


def via_http(url: str, fn: str, data: bytes, headers: dict[str, str], timeout_s: float) -> Outcome:
    start = time.perf_counter()
    verify = broker_settings().tls_ca or True   # a deployment's own CA (up --tls)
    response = httpx.post(f"{url.rstrip('/')}/function/{fn}", content=data, headers=headers, timeout=timeout_s,
                          verify=verify)
    return Outcome(response.status_code, response.content,
                   {k: v for k, v in response.headers.items() if k.lower().startswith("x-")},
                   time.perf_counter() - start)


def _outcome(answer: Answer, elapsed: float) -> Outcome:
    """What ``invoke`` prints: the output, or ``<code> <message>`` of a failure, and the headers."""
    body = answer.output if answer.ok else f"{answer.code} {answer.message}".encode()
    return Outcome(answer.status, body, {k: v for k, v in answer.headers.items() if k.startswith("X-")}, elapsed)


async def via_nats(nats_url: str, node: str, fn: str, data: bytes, headers: dict[str, str], timeout_s: float,
                   prefix: str = "faas", client: str = "cli") -> Outcome:
    nc = await connect(nats_url, "p2pfaas-invoke")
    try:
        async with FaasClient(nc, client=client, prefix=prefix) as faas:
            start = time.perf_counter()
            answer = await faas.invoke(node, fn, data, headers=headers, timeout_s=timeout_s)
            return _outcome(answer, time.perf_counter() - start)
    finally:
        await nc.close()


def via_mqtt(mqtt_url: str, node: str, fn: str, data: bytes, timeout_s: float, prefix: str = "faas",
             client: str = "cli", password: str | None = None) -> Outcome:
    """Publish at QoS 1 like a device named ``client`` and wait on faas/result|reject/<client>/<req>
    (``password``: the device's, when the broker wants identities)."""
    subjects = Subjects(prefix)
    host, port = parse_mqtt_url(mqtt_url)
    req = uuid.uuid4().hex
    answer: list[Answer] = []
    got = threading.Event()
    subscribed = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{client}-{req[:8]}")

    def on_connect(cl, userdata, flags, rc, props):
        cl.subscribe([(f"{prefix}/result/{client}/{req}", 1), (f"{prefix}/reject/{client}/{req}", 1)])

    def on_subscribe(cl, userdata, mid, rcs, props):
        subscribed.set()

    def on_message(cl, userdata, msg):
        kind, _, _ = subjects.answer_ids(from_mqtt(msg.topic))
        answer.append(Answer.of_stored(kind, msg.payload))
        got.set()

    c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
    if password is not None:
        c.username_pw_set(client, password)
    mqtt_tls(c, mqtt_url, broker_settings().tls_ca)
    c.connect(host, port, keepalive=30)
    c.loop_start()
    try:
        if not subscribed.wait(timeout_s):
            raise TimeoutError(f"could not subscribe on {mqtt_url}")
        start = time.perf_counter()
        c.publish(f"{prefix}/{node}/request/{fn}/{client}/{req}", data, qos=1)
        if not got.wait(timeout_s):
            raise TimeoutError(f"no result within {timeout_s:g} s")
        return _outcome(answer[0], time.perf_counter() - start)
    finally:
        c.disconnect()
        c.loop_stop()
