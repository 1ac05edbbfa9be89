"""compose.yaml as written, on a real engine: up, invoke over HTTP and MQTT (with the device's
password), kill one NATS server of the three under load (nothing accepted may be lost), invoke
again, tear down. Driven by docker-compose (v1 from Debian, or v2 as ``docker compose``).

No registry here: the node image is built from this checkout, and stand-ins for the nats and
eclipse-mosquitto images are built on the local Debian base (the nats-server of our venv,
Debian's mosquitto). The first run builds them (~2 min); later runs reuse the cached engine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson
import paho.mqtt.client as mqtt
import pytest
from docker.errors import ImageNotFound

from broker.embedded import find_binary, free_port
from p2pfaas import images
from support import eventually, wait_until

pytestmark = [pytest.mark.compose, pytest.mark.timeout(900)]   # bring-up, load, a NATS server killed, tear-down
ROOT = Path(__file__).resolve().parents[2]
LOAD_RATE = 20.0          # async requests per second, spread over the three bridges
LOAD_SECONDS = 12.0
KILL_AT_S = 4.0


def compose_command() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("neither docker-compose nor `docker compose` is installed (apt-get install -y docker-compose; .ci/run does this)")


def build_standin(client, tag: str, dockerfile: str, files: dict[str, Path]) -> str:
    """An image from an in-memory context (a Dockerfile and files), unless the engine has it."""
    try:
        client.images.get(tag)
        return tag
    except ImageNotFound:
        pass
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, path in files.items():
            tar.add(path, arcname=name)
    buffer.seek(0)
    for chunk in client.api.build(fileobj=buffer, custom_context=True, tag=tag, decode=True, rm=True,
                                  network_mode="host"):
        if "error" in chunk:
            raise RuntimeError(f"building {tag}: {chunk['error']}")
    return tag


@pytest.fixture(scope="module")
def compose_images(docker_client, base_image, build_options) -> dict[str, str]:
    nats_server = Path(find_binary("nats-server"))
    version = subprocess.run([str(nats_server), "--version"], capture_output=True, text=True).stdout.split()[-1]
    apt = "apt-get update -qq && apt-get install -y -qq --no-install-recommends"
    nats = build_standin(docker_client, f"p2pfaas-standin-nats:{version.lstrip('v')}", f"""
        FROM {base_image}
        RUN {apt} wget && rm -rf /var/lib/apt/lists/*
        COPY nats-server /nats-server
        ENTRYPOINT ["/nats-server"]
        """, {"nats-server": nats_server})
    mosquitto = build_standin(docker_client, "p2pfaas-standin-mosquitto:bookworm", f"""
        FROM {base_image}
        RUN {apt} mosquitto mosquitto-clients && rm -rf /var/lib/apt/lists/*
        CMD ["mosquitto", "-c", "/etc/mosquitto/mosquitto.conf"]
        """, {})
    wheel = images.local_torch_wheel()
    options = images.BuildOptions(base=build_options.base, ca_bundle=build_options.ca_bundle,
                                  wheels=[wheel] if wheel else [])
    node = images.ensure_image(docker_client, "node", options)
    return {"P2PFAAS_IMAGE": node, "P2PFAAS_NATS_IMAGE": nats, "P2PFAAS_MOSQUITTO_IMAGE": mosquitto}


class Compose:
    def __init__(self, project: str, env: dict[str, str], files: tuple[str, ...] = ("compose.yaml",)) -> None:
        self.project, self.env, self.files = project, env, files

    def run(self, *args: str, timeout_s: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        files = [arg for name in self.files for arg in ("-f", str(ROOT / name))]
        done = subprocess.run([*compose_command(), "-p", self.project, *files, *args],
                              cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done

    def container(self, client, service: str):
        [found] = client.containers.list(all=True, filters={"label": [f"com.docker.compose.project={self.project}",
                                                                       f"com.docker.compose.service={service}"]})
        return found


@contextlib.contextmanager
def compose_stack(compose_images, *files: str, stop_s: int = 5, **extra: str):
    """The deployment up (one at a time: each test's own), its ports; down, whatever happens."""
    ports = {"P2PFAAS_HTTP_PORT_N1": free_port(), "P2PFAAS_HTTP_PORT_N2": free_port(),
             "P2PFAAS_HTTP_PORT_N3": free_port(), "P2PFAAS_MQTT_PORT": free_port()}
    init = subprocess.run([sys.executable, "-m", "p2pfaas.cli", "compose", "init", "--dir", str(ROOT)],
                          capture_output=True, text=True, timeout=60)   # the documented first step
    assert init.returncode == 0, init.stderr
    device = dict(line.split("=", 1) for line in (ROOT / "compose/secrets/mosquitto.env").read_text().split())
    user, password = device["P2PFAAS_MQTT_DEVICE_0"].split(":", 1)
    env = {**os.environ, **compose_images, **{k: str(v) for k, v in ports.items()},
           "P2PFAAS_MQTT_USER": user, "P2PFAAS_MQTT_PASSWORD": password, **extra}
    compose = Compose(f"p2pfaas{secrets.token_hex(4)}", env, files or ("compose.yaml",))
    try:
        compose.run("up", "-d", "--no-build", timeout_s=600)
        yield compose, ports
    finally:
        logs = compose.run("logs", "--tail", "30", check=False).stdout
        compose.run("down", "-v", "--remove-orphans", "-t", str(stop_s), check=False)
        if os.environ.get("P2PFAAS_COMPOSE_LOGS"):
            print(logs)


@pytest.fixture
def stack(docker_client, compose_images):
    with compose_stack(compose_images) as up:
        yield up


class Device:
    """An MQTT device with a password: requests at QoS 1 (counted when PUBACKed), answers by id."""

    def __init__(self, port: int, user: str, password: str) -> None:
        self.user = user
        self.answers: dict[str, dict] = {}
        self.acked: set[str] = set()
        self.lock = threading.Lock()
        self.paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{user}-{secrets.token_hex(3)}")
        self.paho.username_pw_set(user, password)
        self.connected = threading.Event()
        self.refused: list[str] = []
        self.paho.on_connect = self._on_connect
        self.paho.on_message = self._on_message
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.refused.append(str(reason_code))
            return
        client.subscribe([(f"faas/result/{self.user}/#", 1), (f"faas/reject/{self.user}/#", 1)])
        self.connected.set()

    def _on_message(self, client, userdata, msg) -> None:
        with self.lock:
            self.answers[msg.topic.rsplit("/", 1)[-1]] = orjson.loads(msg.payload)

    def publish(self, node: str, fn: str, req: str, payload: bytes) -> None:
        info = self.paho.publish(f"faas/{node}/request/{fn}/{self.user}/{req}", payload, qos=1)

        def acked() -> None:
            info.wait_for_publish(30)
            if info.is_published():
                with self.lock:
                    self.acked.add(req)
        threading.Thread(target=acked, daemon=True).start()

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


async def wait_healthy(http: httpx.AsyncClient, urls: list[str], timeout_s: float = 300) -> None:
    async def ok(url: str) -> bool:
        try:
            return (await http.get(f"{url}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def all_ok() -> bool:
        return all([await ok(u) for u in urls])
    await eventually(all_ok, bool, timeout_s, interval_s=1.0)   # every bridge healthy


async def test_compose_topology_invokes_over_http_and_mqtt_and_survives_a_nats_server(stack, docker_client):
    compose, ports = stack
    urls = [f"http://127.0.0.1:{ports[f'P2PFAAS_HTTP_PORT_N{i}']}" for i in (1, 2, 3)]
    password = compose.env["P2PFAAS_MQTT_PASSWORD"]
    async with httpx.AsyncClient(timeout=60) as http:
        await wait_healthy(http, urls)
        for url in urls:                                              # every node, over HTTP
            answer = await http.post(f"{url}/function/fib", content=b"20")
            assert answer.status_code == 200 and answer.text == "6765", answer.text
        anonymous = compose.run("exec", "-T", "n1", "python", "-c", ANONYMOUS).stdout
        assert anonymous.startswith("refused:") and "Authorization" in anonymous, anonymous   # no client without an identity
        streams = [line.split() for line in compose.run("exec", "-T", "n1", "python", "-c", STREAMS).stdout.splitlines()]
        assert len(streams) >= 6 and {replicas for _, replicas, _ in streams} == {"3"}, streams   # every stream is R3
        leaders = Counter(leader for _, _, leader in streams)
        victim = leaders.most_common(1)[0][0]                         # the server leading most streams

        intruder = Device(ports["P2PFAAS_MQTT_PORT"], "device", "wrong-password")
        await wait_until(lambda: bool(intruder.refused), timeout_s=10)
        intruder.close()
        device = Device(ports["P2PFAAS_MQTT_PORT"], "device", password)
        assert device.connected.wait(30)
        await wait_until_mqtt_bridge_serves(device)

        report = await load_while_killing(http, urls, device, compose.container(docker_client, victim))
        print(f"\ncompose, NATS server {victim} (leader of {leaders[victim]} of {len(streams)} streams) "
              f"killed under load: {report}")
        if report["http_lost"] or report["mqtt_lost"]:   # what the stack said about each lost call
            logs = compose.run("logs", "--no-color", check=False).stdout.splitlines()
            said = {key: [line for line in logs if key in line][:20] for key in report["http_lost_ids"]}
            # where each one is: its bridge's /result (202: its task is still stored; 404: neither task
            # nor answer), and what JetStream holds (streams, replicas, the intake consumers, its messages)
            states = {}
            for call_id in report["http_lost_ids"]:
                bridge = report["http_lost_at"][call_id]
                answer = await http.get(f"{bridge}/result/{call_id}")
                states[call_id] = (bridge, answer.status_code, answer.text[:200])
            nodes = [f"n{urls.index(report['http_lost_at'][i]) + 1}" for i in report["http_lost_ids"]]
            held = compose.run("exec", "-T", "n1", "python", "-c", WHERE, *report["http_lost_ids"], *nodes,
                               check=False)
            pytest.fail(f"accepted calls lost: {report}\nwhat the stack logged about them: {said}\n"
                        f"their /result: {states}\nJetStream: {held.stdout}{held.stderr[-2000:]}")
        assert report["http_accepted"] > 0.8 * report["http_sent"], report

        for url in urls:                                              # and again, over both
            answer = await http.post(f"{url}/function/echo", content=b"after")
            assert answer.status_code == 200 and answer.text == "after"
        device.publish("n2", "echo", "after", b"after-mqtt")
        await wait_until(lambda: "after" in device.answers, timeout_s=60)
        assert device.answers["after"]["output"] == "after-mqtt"
        device.close()


ANONYMOUS = """
import asyncio, os, nats
async def main():
    try:
        nc = await nats.connect(os.environ["P2PFAAS_NATS_URL"], allow_reconnect=False, connect_timeout=3)
    except Exception as exc:
        print("refused:", type(exc).__name__, exc)
        return
    await nc.close()
    print("accepted")
asyncio.run(main())
"""


STREAMS = """
import asyncio, os, nats
async def main():
    nc = await nats.connect(os.environ["P2PFAAS_NATS_URL"], user=os.environ["P2PFAAS_NATS_USER"],
                            password=os.environ["P2PFAAS_NATS_PASSWORD"])
    for info in await nc.jetstream().streams_info():
        print(info.config.name, info.config.num_replicas, info.cluster.leader)
    await nc.close()
asyncio.run(main())
"""


WHERE = """
import asyncio, os, sys, nats
async def main():
    nc = await nats.connect(os.environ["P2PFAAS_NATS_URL"], user=os.environ["P2PFAAS_NATS_USER"],
                            password=os.environ["P2PFAAS_NATS_PASSWORD"])
    js = nc.jetstream()
    half = (len(sys.argv) - 1) // 2
    ids, nodes = sys.argv[1:1 + half], sys.argv[1 + half:]
    for info in await js.streams_info():
        cluster = info.cluster
        replicas = [(r.name, r.current, r.lag) for r in (cluster.replicas or [])] if cluster else []
        print("stream", info.config.name, "msgs", info.state.messages, "last", info.state.last_seq,
              "leader", cluster.leader if cluster else None, "replicas", replicas)
        if info.config.name.endswith("ASYNC"):
            for c in await js.consumers_info(info.config.name):
                print("  consumer", c.name, "pending", c.num_pending, "ack_pending", c.num_ack_pending,
                      "redelivered", c.num_redelivered, "delivered", c.delivered.stream_seq,
                      "ack_floor", c.ack_floor.stream_seq, "leader", c.cluster.leader if c.cluster else None)
        for call_id, node in zip(ids, nodes):
            for subject in (f"faas.async.{node}.sleep.http-{node}.{call_id}", f"faas.result.http-{node}.{call_id}",
                            f"faas.reject.http-{node}.{call_id}"):
                try:
                    msg = await js.get_last_msg(info.config.name, subject)
                    print("  found", subject, "seq", msg.seq, "headers", msg.headers)
                except Exception:
                    pass
    await nc.close()
asyncio.run(main())
"""


async def wait_until_mqtt_bridge_serves(device: Device) -> None:
    """The bridge subscribes after its own start: retry a probe request until one is answered."""
    deadline = time.monotonic() + 120
    attempt = 0
    while not any(k.startswith("probe") for k in device.answers):
        assert time.monotonic() < deadline, "the MQTT bridge answered no probe within 120 s"
        device.publish("n1", "echo", f"probe{attempt}", b"probe")
        attempt += 1
        await asyncio.sleep(2.0)


async def load_while_killing(http, urls, device, victim) -> dict:
    """Open-loop async load (HTTP /async-function + MQTT QoS 1) for LOAD_SECONDS; ``victim`` is
    killed at KILL_AT_S. Lost = accepted (202 / PUBACK) but never answered. An answer is the
    stored result, a success or the node's JSON error (e.g. 503 when the backlog that built up
    during the election overflows K + queue); a bridge failing to look it up is not one."""
    accepted: dict[str, str] = {}   # call id -> bridge URL
    http_sent = mqtt_sent = 0
    refused: Counter = Counter()
    killed_at = None
    start = time.monotonic()
    tick = 0
    while (now := time.monotonic() - start) < LOAD_SECONDS:
        if killed_at is None and now >= KILL_AT_S:
            victim.kill()
            killed_at = now
        url = urls[tick % 3]
        http_sent += 1
        try:
            answer = await http.post(f"{url}/async-function/sleep", content=b"0.05", timeout=10)
            if answer.status_code == 202:
                accepted[answer.headers["X-Call-Id"]] = url
            else:
                refused[answer.status_code] += 1
        except httpx.HTTPError as exc:
            refused[type(exc).__name__] += 1
        if tick % 2 == 0:
            mqtt_sent += 1
            device.publish(f"n{tick % 3 + 1}", "echo", f"load{tick}", b"x")
        tick += 1
        await asyncio.sleep(max(0.0, tick / LOAD_RATE - (time.monotonic() - start)))

    answers: dict[str, int] = {}
    deadline = time.monotonic() + 120
    while len(answers) < len(accepted) and time.monotonic() < deadline:
        for call_id, url in accepted.items():
            if call_id not in answers:
                status = await stored_answer(http, [url, *urls], call_id)
                if status is not None:
                    answers[call_id] = status
        await asyncio.sleep(0.5)
    mqtt_deadline = time.monotonic() + 60
    while time.monotonic() < mqtt_deadline:
        with device.lock:
            if device.acked <= set(device.answers):
                break
        await asyncio.sleep(0.5)
    with device.lock:
        mqtt_acked = {r for r in device.acked if r.startswith("load")}
        mqtt_answered = {r for r in mqtt_acked if r in device.answers}
    return {"http_sent": http_sent, "http_accepted": len(accepted), "http_refused": dict(refused),
            "http_answered": dict(Counter(answers.values())), "http_lost": len(accepted) - len(answers),
            "http_lost_ids": sorted(set(accepted) - set(answers)), "http_errors": dict(ERRORS),
            "http_lost_at": {i: accepted[i] for i in set(accepted) - set(answers)},
            "mqtt_sent": mqtt_sent, "mqtt_acked": len(mqtt_acked), "mqtt_answered": len(mqtt_answered),
            "mqtt_lost": len(mqtt_acked) - len(mqtt_answered), "killed_at_s": round(killed_at or -1, 1)}


ERRORS: Counter = Counter()   # (status, start of the message) of the error answers found


async def stored_answer(http, urls: list[str], call_id: str) -> int | None:
    """The status of the stored answer to ``call_id`` through the first bridge that has it."""
    for url in urls:
        try:
            answer = await http.get(f"{url}/result/{call_id}")
        except httpx.HTTPError:
            continue
        if answer.status_code == 200:
            return 200
        if answer.status_code not in (202, 404) and answer.headers.get("content-type", "").startswith("application/json"):
            ERRORS[answer.status_code, str(answer.json().get("message", ""))[:60]] += 1
            return answer.status_code
    return None


async def test_compose_with_container_workers_serves_from_worker_containers(docker_client, compose_images,
                                                                           worker_image):
    """compose.yaml + compose/containers.yaml: every node starts its workers as containers of the
    worker image on the engine it is given, on the deployment's network (docs/containers.md)."""
    host = docker_client.api.base_url
    socket = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    assert os.path.exists(socket), f"the engine's socket {socket} ({host}) is not a local file"
    network = f"p2pfaas-{secrets.token_hex(3)}"
    # a node given 30 s to stop stops its worker containers itself
    with compose_stack(compose_images, "compose.yaml", "compose/containers.yaml", stop_s=30,
                       P2PFAAS_WORKER_IMAGE=worker_image, P2PFAAS_DOCKER_SOCKET=socket,
                       DOCKER_GID=str(os.stat(socket).st_gid), P2PFAAS_NETWORK=network) as (compose, ports):
        urls = [f"http://127.0.0.1:{ports[f'P2PFAAS_HTTP_PORT_N{i}']}" for i in (1, 2, 3)]
        async with httpx.AsyncClient(timeout=60) as http:
            await wait_healthy(http, urls)
            for url in urls:
                answer = await eventually(lambda url=url: http.post(f"{url}/function/fib", content=b"20"),
                                          lambda r: r.status_code == 200, 120, interval_s=1.0)
                assert answer.text == "6765", answer.text
        workers = docker_client.containers.list(filters={"label": ["p2pfaas.role=worker"]})
        mine = [c for c in workers if network in c.attrs["NetworkSettings"]["Networks"]]
        assert {c.labels["p2pfaas.node"] for c in mine} == {"n1", "n2", "n3"}
        assert all(c.image.tags[0] == worker_image for c in mine)
    leftover = [c for c in docker_client.containers.list(all=True, filters={"label": ["p2pfaas.role=worker"]})
                if network in c.attrs["NetworkSettings"]["Networks"]]
    for container in leftover:
        container.remove(force=True)
    assert leftover == [], [c.name for c in leftover]   # the nodes removed their workers as they stopped
