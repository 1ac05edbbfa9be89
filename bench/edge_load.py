"""Open-loop load on one device, on every transport at once, from wherever it runs (bench/edge.py
runs it inside an emulated machine's namespace): HTTP direct, HTTP async (``/async-function`` +
``/result``) and MQTT QoS 1 (a device of the device's own listener, persistent session), each a
Poisson stream. Every call is written to ``--out`` (JSON lines at the end): its transport, when it
was sent, when and how it was answered, and by which node.

  python bench/edge_load.py --url http://10.77.0.4:18080 --mqtt 10.77.0.4:1883 --user dev --password ... \\
      --rate 4 --seconds 40 --out load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import threading
import time

import httpx
import paho.mqtt.client as mqtt

ANSWER_WAIT_S = 120.0   # after the load: how long answers are waited for (then a call is lost)


def record(**fields) -> dict:
    return {"sent": time.time(), "answered": None, "status": None, "by": None, "answers": 0, **fields}


async def http_direct(http: httpx.AsyncClient, url: str, fn: str, body: bytes, calls: list[dict]) -> None:
    call = record(transport="http-direct", id=f"d{len(calls)}")
    calls.append(call)
    try:
        r = await http.post(f"{url}/function/{fn}", content=body)
        call.update(answered=time.time(), status=r.status_code, by=r.headers.get("X-P2pfaas-Executed-By"), answers=1)
    except httpx.HTTPError as exc:   # refused, reset, timed out: no answer (a direct call is not stored)
        call.update(error=f"{type(exc).__name__}: {exc}")


async def http_async(http: httpx.AsyncClient, url: str, fn: str, body: bytes, calls: list[dict], until: float) -> None:
    call = record(transport="http-async", id=None)
    calls.append(call)
    try:
        r = await http.post(f"{url}/async-function/{fn}", content=body)
    except httpx.HTTPError as exc:
        call.update(error=f"not accepted: {type(exc).__name__}: {exc}")
        return
    if r.status_code != 202:
        call.update(error=f"not accepted: {r.status_code} {r.text[:100]}")
        return
    call.update(id=r.headers["X-Call-Id"], accepted=True)
    while time.time() < until:
        try:
            answer = await http.get(f"{url}/result/{call['id']}")
        except httpx.HTTPError:
            await asyncio.sleep(0.5)   # the device may be unreachable from here for a while
            continue
        if answer.status_code != 202:
            body_json = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
            call.update(answered=time.time(), status=answer.status_code, answers=1,
                        by=answer.headers.get("X-P2pfaas-Executed-By") or body_json.get("executed_by"))
            return
        await asyncio.sleep(0.25)


class MqttDevice:
    """A device on the node's MQTT listener: persistent session, QoS 1, its answers counted by id
    (a QoS 1 redelivery of the same answer is counted as such, not as a second answer)."""

    def __init__(self, host: str, port: int, user: str, password: str, node: str, prefix: str = "faas") -> None:
        self.node, self.user, self.prefix = node, user, prefix
        self.calls: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{user}-load",
                                  protocol=mqtt.MQTTv311, clean_session=False)
        self.client.username_pw_set(user, password)
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, f, rc, p=None: c.subscribe(
            [(f"{prefix}/result/{user}/#", 1), (f"{prefix}/reject/{user}/#", 1)])
        self.client.connect(host, port, keepalive=5)
        self.client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        req = msg.topic.rsplit("/", 1)[1]
        with self.lock:
            call = self.calls.get(req)
            if call is None:
                return
            try:
                body = json.loads(msg.payload)
            except ValueError:
                body = {}
            if call["answered"] is None:
                call.update(answered=time.time(), status=body.get("http_status") or body.get("status"),
                            by=body.get("executed_by") or body.get("node"), payload=msg.payload.decode(errors="replace"))
            call["answers"] += 1
            call.setdefault("distinct", [])
            if msg.payload.decode(errors="replace") not in call["distinct"]:
                call["distinct"].append(msg.payload.decode(errors="replace"))

    def send(self, fn: str, body: bytes, calls: list[dict]) -> None:
        req = f"m{len(self.calls)}-{os.getpid()}"
        call = record(transport="mqtt", id=req)
        with self.lock:
            self.calls[req] = call
        calls.append(call)
        info = self.client.publish(f"{self.prefix}/{self.node}/request/{fn}/{self.user}/{req}", body, qos=1)

        def acked() -> None:   # PUBACK: the broker has it
            try:
                info.wait_for_publish(ANSWER_WAIT_S)
                call["accepted"] = info.is_published()
            except (RuntimeError, ValueError) as exc:
                call["error"] = f"not published: {exc}"

        threading.Thread(target=acked, daemon=True).start()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--node", required=True, help="the device's node id (its MQTT request topics)")
    parser.add_argument("--mqtt", help="HOST:PORT of the device's MQTT listener (no MQTT load without it)")
    parser.add_argument("--user")
    parser.add_argument("--password")
    parser.add_argument("--fn", default="sleep")
    parser.add_argument("--body", default="0.05")
    parser.add_argument("--rate", type=float, default=4.0, help="calls per second per transport")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--transports", default="http-direct,http-async,mqtt")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    transports = args.transports.split(",")
    rng = random.Random(args.seed)
    calls: list[dict] = []
    body = args.body.encode()
    device = None
    if "mqtt" in transports and args.mqtt:
        host, port = args.mqtt.rsplit(":", 1)
        device = MqttDevice(host, int(port), args.user, args.password, args.node)
    started = time.time()
    until = started + args.seconds + ANSWER_WAIT_S
    tasks: list[asyncio.Task] = []
    async with httpx.AsyncClient(timeout=30) as http:
        async def stream(transport: str) -> None:
            t = started
            while True:
                t += rng.expovariate(args.rate)
                if t - started > args.seconds:
                    return
                await asyncio.sleep(max(0.0, t - time.time()))
                if transport == "http-direct":
                    tasks.append(asyncio.create_task(http_direct(http, args.url, args.fn, body, calls)))
                elif transport == "http-async":
                    tasks.append(asyncio.create_task(http_async(http, args.url, args.fn, body, calls, until)))
                elif device is not None:
                    device.send(args.fn, body, calls)

        await asyncio.gather(*(stream(t) for t in transports))
        await asyncio.gather(*tasks)
        while device is not None and time.time() < until and any(
                c["answered"] is None and c.get("error") is None for c in calls if c["transport"] == "mqtt"):
            await asyncio.sleep(0.25)
        await asyncio.sleep(2.0 if device is not None else 0)   # the window in which a second answer would come
    if device is not None:
        device.close()
    with open(args.out, "w") as f:
        json.dump({"started": started, "seconds": args.seconds, "calls": calls}, f)


if __name__ == "__main__":
    asyncio.run(main())
