"""Every security rule of docs/security.md, tried with the wrong identity (refused) and the right
one (allowed), on a real nats-server with the generated accounts, a real Mosquitto with the
generated password file and ACL, and the HTTP bridge with its tokens."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import nats
import orjson
import paho.mqtt.client as mqtt
import pytest

from broker import headers as H
from broker.auth import BRIDGE, CONTROLLER, OPERATOR, AuthStore, AuthStoreError, Credentials, mqtt_bridge_client_id
from broker.permissions import mosquitto_files, nats_accounts
from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.control import control_request
from broker.errors import NotPermitted
from broker.embedded import Mosquitto, NatsServer
from broker.http_bridge import HttpBridge
from broker.messages import NodeConfiguration, SchedulerConfiguration
from broker.streams import async_stream, results_stream
from broker.subjects import Subjects
from nodes.node import Node
from nodes.settings import NodeSettings
from stack_processes import P2PFAAS
from support import eventually, serving, wait_until

PREFIX = "sec"
S = Subjects(PREFIX)


@pytest.fixture(scope="module")
async def secure(tmp_path_factory):
    """A secure nats-server (with its MQTT listener) and node n1 running under its own identity."""
    base = tmp_path_factory.mktemp("secure")
    store = AuthStore(base / "auth")
    for device in ("dev1", "dev2"):
        store.device(device)
    server = NatsServer(data_dir=base / "nats", port=None, mqtt_port=0, accounts=nats_accounts(store, ["n1", "n2"]))
    await server.start()
    node_creds, worker_creds = store.node("n1"), store.worker("n1")
    settings = NodeSettings(node_id="n1", nats_url=server.url, prefix=PREFIX, data_dir=base / "node", learner=False,
                            runtime="process", initial=NodeConfiguration(parallel_running_functions_max=2),
                            initial_scheduler=SchedulerConfiguration(name="NoScheduler", parameters=["true"]))
    identity = {"P2PFAAS_NATS_USER": node_creds.user, "P2PFAAS_NATS_PASSWORD": node_creds.password,
                "P2PFAAS_WORKER_NATS_USER": worker_creds.user, "P2PFAAS_WORKER_NATS_PASSWORD": worker_creds.password}
    os.environ.update(identity)   # as `up` gives a node its identity (only while it starts: other tests share the process)
    try:
        node = await Node(settings).start()
        await node.pool.wait_ready(60)
    finally:
        for key in identity:
            os.environ.pop(key, None)
    try:
        yield server, store
    finally:
        await node.stop()
        await server.stop()


class Identity:
    """A NATS connection as ``creds``, keeping the server's permission errors."""

    def __init__(self, server: NatsServer, creds: Credentials) -> None:
        self.server, self.creds, self.errors = server, creds, []
        self.nc = None

    async def __aenter__(self) -> "Identity":
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))
        self.nc = await nats.connect(self.server.url, user=self.creds.user, password=self.creds.password,
                                     error_cb=on_error, allow_reconnect=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await close_quietly(self.nc)

    async def refused(self, subject: str, body: bytes = b"{}") -> bool:
        """Publish; True when the server refused it (a permissions violation came back)."""
        before = len(self.errors)
        await self.nc.publish(subject, body)
        await self.nc.flush()
        try:
            await wait_until(lambda: len(self.errors) > before, timeout_s=2)
        except AssertionError:
            return False
        error = self.errors[-1].lower()   # nats-py lowercases the server's message, subject included
        return "permissions violation" in error and subject.lower() in error

    async def refusals_before(self, subjects: list[str], forbidden: str) -> list[str]:
        """Publish ``subjects`` then ``forbidden``; once the server refused ``forbidden`` (its errors
        come in order), the refusals that came before it -- the ones of ``subjects``."""
        before = len(self.errors)
        for subject in [*subjects, forbidden]:
            await self.nc.publish(subject, b"{}")
        await self.nc.flush()
        forbidden = forbidden.lower()   # nats-py lowercases the server's message
        await wait_until(lambda: any(forbidden in e.lower() for e in self.errors[before:]), timeout_s=5)
        return [e for e in self.errors[before:] if forbidden not in e.lower()]


async def test_anonymous_and_wrong_passwords_are_refused(secure):
    server, store = secure
    with pytest.raises(Exception, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0)
    with pytest.raises(Exception, match="Authorization Violation"):
        await nats.connect(server.url, user=OPERATOR, password="guess", allow_reconnect=False, max_reconnect_attempts=0)


async def test_the_containers_health_check_asks_with_the_containers_identity(secure, monkeypatch):
    """compose.yaml's node health check runs with the node's env file: anonymous, it is turned away
    (unhealthy); with the node's identity, the node answers (healthy)."""
    from p2pfaas.healthcheck import main

    server, store = secure
    monkeypatch.setenv("P2PFAAS_NATS_URL", server.url)
    monkeypatch.setenv("P2PFAAS_PREFIX", PREFIX)
    for name in ("P2PFAAS_NATS_USER", "P2PFAAS_NATS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    assert await asyncio.to_thread(main, ["node", "n1"]) == 1
    creds = store.node("n1")
    monkeypatch.setenv("P2PFAAS_NATS_USER", creds.user)
    monkeypatch.setenv("P2PFAAS_NATS_PASSWORD", creds.password)
    assert await asyncio.to_thread(main, ["node", "n1"]) == 0


async def test_only_nodes_publish_results_rejects_forwards_membership_telemetry_rewards(secure):
    server, store = secure
    node_only = [S.result("dev1", "x"), S.reject("dev1", "x"), S.forward("n2", "echo", "dev1", "x"),
                 S.membership("n1"), S.telemetry("n1", "default"), S.reward("n1")]
    async with Identity(server, store.worker("n1")) as worker, Identity(server, store.service(CONTROLLER)) as controller:
        for subject in node_only:
            assert await worker.refused(subject), subject        # user code cannot forge answers
        for subject in node_only[:4]:
            assert await controller.refused(subject), subject
    async with Identity(server, store.node("n1")) as n1:
        for subject in node_only:
            assert not await n1.refused(subject), subject
        assert await n1.refused(S.membership("n2"))              # and only its own membership ...
        assert await n1.refused(S.telemetry("n2", "default"))    # ... telemetry and rewards
        assert await n1.refused(S.reward("n2"))


async def test_only_controllers_publish_scale_commands(secure):
    server, store = secure
    async with Identity(server, store.node("n1")) as n1, Identity(server, store.worker("n1")) as worker:
        assert await n1.refused(S.scale("n1", "default"))
        assert await worker.refused(S.scale("n1", "default"))
    async with Identity(server, store.service(CONTROLLER)) as controller:
        assert not await controller.refused(S.scale("n1", "farm"))


async def test_only_operators_change_configuration_and_streams(secure):
    server, store = secure
    body = orjson.dumps({"parallel_running_functions_max": 2})
    async with Identity(server, store.node("n1")) as n1, Identity(server, store.service(CONTROLLER)) as controller:
        assert await n1.refused(S.config("n1", "set"), body)
        assert await controller.refused(S.config("n1", "set"), body)
        assert await controller.refused(S.scheduler_config("n1", "set"), body)
        assert await controller.refused(S.learner("n1", "scheduling", "parameters.set"), body)
        # a node provisions streams, never deletes them: the server refuses the API request itself
        assert await n1.refused(f"$JS.API.STREAM.DELETE.{results_stream(S)}")
    async with Identity(server, store.service(OPERATOR)) as operator:
        reply = await operator.nc.request(S.config("n1", "set"), body, timeout=5)
        assert reply.headers[H.STATUS] == "200"
        assert (await operator.nc.jetstream().stream_info(async_stream(S))).config.name == async_stream(S)
        assert (await operator.nc.jetstream().stream_info(results_stream(S))).config.name == results_stream(S)


async def test_the_bridge_may_publish_what_its_routes_ask(secure):
    """Every kind of subject an HTTP route of the bridge publishes to (docs/compat.md's routes)."""
    server, store = secure
    asked = [S.request("n1", "echo", "http-n1", "a"), S.async_request("n1", "echo", "http-n1", "b"),
             S.forward("n1", "echo", "http-n1", "c"), S.config("n1", "get"), S.scheduler_config("n1", "set"),
             S.functions("n1", "deploy"), S.functions("n1", "scale_delay"), S.discovery("n1", "register"),
             S.discovery("n1", "config.set"), S.peers("n1"), S.load("n1"), S.info("n1"), S.metrics("n1"),
             S.learner("n1", "scheduling", "reset"), S.scale("n1", "farm"), S.reward("n1")]
    async with Identity(server, store.service(BRIDGE)) as bridge:
        # a forged answer is refused (it never forges one), and nothing it asks before that is
        assert await bridge.refusals_before(asked, S.result("dev1", "x")) == []


async def test_a_refused_request_fails_at_once_not_at_its_timeout(secure):
    """The broker refuses a publish asynchronously; the caller hears NotPermitted at once."""
    server, store = secure
    creds = store.worker("n1")
    nc = await connect(server.url, "refused", credentials=(creds.user, creds.password))
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(NotPermitted):
            await control_request(nc, S.config("n1", "set"), b"{}", timeout_s=30)
        async with FaasClient(nc, client="w", prefix=PREFIX) as faas:
            with pytest.raises(NotPermitted):
                await faas.invoke("n1", "echo", b"x", timeout_s=30)
        assert asyncio.get_running_loop().time() - started < 10
    finally:
        await close_quietly(nc)


def mqtt_client(port: int, user: str, password: str) -> tuple[mqtt.Client, dict]:
    state: dict = {"suback": None, "messages": [], "connected": threading.Event(), "subscribed": threading.Event()}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{user}-{id(state)}")
    client.username_pw_set(user, password)

    def on_connect(c, userdata, flags, reason, props):
        state["rc"] = reason
        state["connected"].set()

    def on_subscribe(c, userdata, mid, reasons, props):
        state["suback"] = [r.value for r in reasons]
        state["subscribed"].set()

    client.on_connect, client.on_subscribe = on_connect, on_subscribe
    client.on_message = lambda c, u, m: state["messages"].append((m.topic, m.payload))
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert state["connected"].wait(10)
    return client, state


async def test_a_device_publishes_only_its_own_requests_and_reads_only_its_own_answers(secure):
    server, store = secure
    dev1 = store.device("dev1")
    client, state = mqtt_client(server.mqtt_port, dev1.user, dev1.password)
    try:
        client.subscribe(f"{PREFIX}/result/dev2/#", qos=1)       # another device's answers
        assert state["subscribed"].wait(10) and state["suback"] == [128]
        state["subscribed"].clear()
        client.subscribe(f"{PREFIX}/result/dev1/#", qos=1)
        assert state["subscribed"].wait(10) and state["suback"] == [1]
        client.publish(f"{PREFIX}/n1/request/echo/dev2/forged", b"as dev2", qos=1).wait_for_publish(10)
        client.publish(f"{PREFIX}/n1/request/echo/dev1/own", b"as dev1", qos=1).wait_for_publish(10)
        await wait_until(lambda: any(t.endswith("/own") for t, _ in state["messages"]), timeout_s=20)
        assert orjson.loads(dict(state["messages"])[f"{PREFIX}/result/dev1/own"])["output"] == "as dev1"
    finally:
        client.disconnect()
        client.loop_stop()
    async with Identity(server, store.service(OPERATOR)) as operator:   # the forged one was never stored
        async with FaasClient(operator.nc, client="dev2", prefix=PREFIX) as faas:
            assert await faas.stored_answer("dev2", "forged") is None
    log = server.log_path.read_text()
    assert "Publish Violation" in log and f"{PREFIX}.async.n1.echo.dev2.forged" in log   # dropped, and said so
    intruder, refused = mqtt_client(server.mqtt_port, "dev1", "wrong-password")
    try:
        assert refused["rc"].is_failure   # CONNACK: not authorised
    finally:
        intruder.disconnect()
        intruder.loop_stop()


async def test_mosquitto_acl_gives_devices_their_own_topics_only(tmp_path):
    if shutil.which("mosquitto_passwd") is None:
        pytest.fail("mosquitto not installed (.ci/run installs it)")
    store = AuthStore(tmp_path / "auth")
    dev1 = store.device("dev1")
    broker = Mosquitto(data_dir=tmp_path / "mosquitto", port=None,
                       auth=mosquitto_files(store, PREFIX, tmp_path / "mosquitto" / "auth"))
    await broker.start()
    try:
        anonymous = subprocess.run(["mosquitto_pub", "-p", str(broker.port), "-t", "x", "-m", "y"], capture_output=True, text=True)
        assert anonymous.returncode != 0 and "not authori" in anonymous.stderr.lower()
        bridge = store.service(BRIDGE)
        watcher, seen = mqtt_client(broker.port, bridge.user, bridge.password)   # the bridge reads everything
        watcher.subscribe(f"{PREFIX}/#", qos=1)
        assert seen["subscribed"].wait(10)
        device, state = mqtt_client(broker.port, dev1.user, dev1.password)
        device.subscribe([(f"{PREFIX}/result/dev2/#", 1), (f"{PREFIX}/result/dev1/#", 1)])
        assert state["subscribed"].wait(10)
        device.publish(f"{PREFIX}/n1/request/echo/dev2/forged", b"x", qos=1).wait_for_publish(10)
        device.publish(f"{PREFIX}/result/dev2/forged", b"{}", qos=1).wait_for_publish(10)
        device.publish(f"{PREFIX}/n1/request/echo/dev1/own", b"x", qos=1).wait_for_publish(10)
        await wait_until(lambda: any(t.endswith("/own") for t, _ in seen["messages"]), timeout_s=10)
        watcher.publish(f"{PREFIX}/result/dev2/r", b"{}", qos=1).wait_for_publish(10)
        watcher.publish(f"{PREFIX}/result/dev1/r", b"{}", qos=1).wait_for_publish(10)
        await wait_until(lambda: any(t == f"{PREFIX}/result/dev1/r" for t, _ in state["messages"]), timeout_s=10)
        assert [t for t, _ in seen["messages"] if "forged" in t] == []          # denied publishes never arrive
        assert all("dev2" not in t for t, _ in state["messages"])             # nor another device's answers
        for client in (watcher, device):
            client.disconnect()
            client.loop_stop()
    finally:
        await broker.stop()


async def test_http_state_changes_need_the_operator_token_and_callbacks_an_allowed_host(node_factory, nc, prefix):
    async with node_factory(k=1), serving(HttpBridge(nc, "n1", prefix=prefix, operator_token="op-token",
                                                     invoke_token="call-token", callback_hosts=["127.0.0.1"])) as http:
        body = {"parallel_running_functions_max": 2}
        assert (await http.post("/configuration", json=body)).status_code == 401
        r = await http.post("/configuration", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert (await http.post("/configuration", json=body, headers={"Authorization": "Bearer op-token"})).status_code == 200
        for path in ("/learner/reset", "/learner/train"):
            assert (await http.get(path)).status_code == 401, path
        assert (await http.post("/ui/api/nodes/n1/configuration", json=body)).status_code == 401
        assert (await http.get("/configuration")).status_code == 200           # reading stays open
        assert (await http.post("/function/echo", content=b"x")).status_code == 401   # invoke token configured
        r = await http.post("/function/echo", content=b"x", headers={"Authorization": "Bearer call-token"})
        assert r.status_code == 200 and r.content == b"x"
        call = {"Authorization": "Bearer call-token"}
        r = await http.post("/async-function/echo", content=b"x", headers={**call, H.CALLBACK_URL: "http://10.0.0.1/steal"})
        assert r.status_code == 403 and "not allowed" in r.json()["message"]
        r = await http.post("/async-function/echo", content=b"x", headers={**call, H.CALLBACK_URL: "http://127.0.0.1:1/cb"})
        assert r.status_code == 202


async def test_slow_clients_are_cut_off(node_factory, nc, prefix):
    from broker.http.limits import HttpLimits

    async with node_factory(k=1), serving(HttpBridge(nc, "n1", prefix=prefix,
                                                     limits=HttpLimits(header_timeout_s=0.5))) as http:
        port = httpx.URL(str(http.base_url)).port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /function/echo HTTP/1.1\r\nHost: x\r\n")     # and never the rest of the headers
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""              # closed by the server
        writer.close()
        assert (await http.post("/function/echo", content=b"still")).content == b"still"


async def test_identity_store_files_are_private(tmp_path):
    store = AuthStore(tmp_path / "auth")
    store.device("dev1")
    store.operator_token()
    assert oct(store.directory.stat().st_mode)[-3:] == "700"
    for path in Path(store.directory).iterdir():
        assert oct(path.stat().st_mode)[-3:] == "600", path
    assert store.device("dev1") == store.device("dev1")   # shown, not replaced
    with pytest.raises(ValueError):
        store.device("no/slashes")


def test_nats_configuration_holds_cheap_bcrypt_hashes_of_long_random_passwords(tmp_path):
    """No password in clear in the generated accounts, only bcrypt hashes at BCRYPT_ROUNDS (the
    cost nats-server pays per CONNECT); cheap is safe because every password is 192 random bits."""
    import bcrypt

    from broker.auth import BCRYPT_ROUNDS

    store = AuthStore(tmp_path / "auth")
    device = store.device("dev1")
    text = nats_accounts(store, ["n1"])
    accounts = json.loads(text.removeprefix("accounts ").strip())
    users = [u for account in accounts.values() for u in account["users"]]
    known = {store.service(OPERATOR).user: store.service(OPERATOR).password,
             store.worker("n1").user: store.worker("n1").password, device.user: device.password}
    assert set(known) <= {u["user"] for u in users}
    for user in users:
        assert user["password"].startswith(f"$2b${BCRYPT_ROUNDS:02d}$") and BCRYPT_ROUNDS == 4
        if user["user"] in known:
            password = known[user["user"]]
            assert password not in text and len(password) == 32   # token_urlsafe(24): 192 bits
            assert bcrypt.checkpw(password.encode(), user["password"].encode())


def test_mosquitto_passwords_and_tls_keys_are_private(tmp_path):
    """Mosquitto's password file holds every password in clear until ``mosquitto_passwd`` hashes
    it: its directory is as private as auth/ (a local user cannot open the file in that moment), as
    is the TLS directory when it was made beforehand (to put a CA of one's own in it)."""
    if shutil.which("mosquitto_passwd") is None:
        pytest.fail("mosquitto not installed (.ci/run installs it)")
    from broker.tls import ensure_certificates

    store = AuthStore(tmp_path / "auth")
    dev1 = store.device("dev1")
    passwords, acl = mosquitto_files(store, PREFIX, tmp_path / "mosquitto" / "auth")
    (tmp_path / "tls").mkdir(mode=0o755)
    files = ensure_certificates(tmp_path / "tls", ["127.0.0.1"])
    for path in (passwords.parent, files.key.parent):
        assert oct(path.stat().st_mode)[-3:] == "700", path
    for path in (passwords, acl, files.key, tmp_path / "tls" / "ca-key.pem"):
        assert oct(path.stat().st_mode)[-3:] == "600", path
    assert dev1.password not in passwords.read_text()   # hashed


def test_identities_added_by_many_processes_at_once_are_all_kept(tmp_path):
    """16 ``p2pfaas auth device`` at once (a script enrolling devices): each identity printed is
    stored with the password printed, the file stays valid JSON, nothing is left behind."""
    store = AuthStore(tmp_path / "auth")
    store.service(OPERATOR)   # as `up` leaves it
    names = [f"dev{i}" for i in range(12)] + ["shared"] * 4
    procs = [subprocess.Popen([*P2PFAAS, "auth", "device", name, "--data-dir", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in names]
    printed: dict[str, set[str]] = {}
    try:
        for name, proc in zip(names, procs):
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0 and not err, err
            creds = json.loads(out)
            assert creds["user"] == name
            printed.setdefault(name, set()).add(creds["password"])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
    stored = json.loads((store.directory / "devices.json").read_text())
    assert {name: {password} for name, password in stored.items()} == printed   # "shared": one password
    assert sorted(p.name for p in store.directory.iterdir()) == [".lock", "devices.json", "services.json"]


def test_a_broken_identity_file_leaves_the_identities_read_before_in_force(tmp_path, caplog):
    store = AuthStore(tmp_path / "auth")
    dev1 = store.device("dev1")
    nats_accounts(store, ["n1"])                                      # what `up` reads when it starts
    (store.directory / "devices.json").write_text('{"dev1": "')       # then someone breaks it by hand
    with caplog.at_level(logging.ERROR, logger="broker.auth"):
        accounts = nats_accounts(store, ["n1"])                       # what `up` renders when it notices
    assert '"user": "dev1"' in accounts and "devices.json is not valid JSON" in caplog.text
    assert store.device("dev1") == dev1
    for writer in (store, AuthStore(store.directory)):                # never overwritten with less
        with pytest.raises(AuthStoreError, match="fix or remove it"):
            writer.device("dev2")
    with pytest.raises(AuthStoreError):                               # a new reader has nothing to fall back on
        AuthStore(store.directory).devices()


async def test_up_keeps_watching_identities_when_a_file_is_broken(tmp_path, caplog):
    """``up``'s identity reload survives a broken file (logged, the last good identities stay)
    and serves the identities added once it is fixed."""
    from p2pfaas.stack import Stack
    from p2pfaas.stack_settings import StackSettings

    stack = Stack(StackSettings(nodes=1, data_dir=tmp_path))
    rendered: list[str] = []
    stack.nats_server = SimpleNamespace(reconfigure=rendered.append)   # what the server would be told
    store = AuthStore(tmp_path / "auth")
    store.device("dev1")
    nats_accounts(store, stack.settings.node_ids)
    watch = asyncio.create_task(stack._reload_on_new_identities(store, store.changed_at(), None, period_s=0.05))
    try:
        await asyncio.sleep(0.1)
        with caplog.at_level(logging.ERROR, logger="broker.auth"):
            (store.directory / "devices.json").write_text("{")
            await wait_until(lambda: rendered, 10)
        assert '"user": "dev1"' in rendered[-1] and "not valid JSON" in caplog.text and not watch.done()
        (store.directory / "devices.json").unlink()
        AuthStore(store.directory).device("dev2")
        await wait_until(lambda: '"user": "dev2"' in rendered[-1], 10)
    finally:
        watch.cancel()


async def test_tls_on_nats_mqtt_and_http_with_a_ca_of_our_own(tmp_path, node_factory, nc, prefix):
    from broker.connection import connect
    from broker.embedded import free_port
    from broker.errors import BrokerUnavailable
    from broker.tls import ensure_certificates

    files = ensure_certificates(tmp_path / "tls", ["127.0.0.1"])
    assert ensure_certificates(tmp_path / "tls", ["127.0.0.1"]) == files          # made once, then reused
    server = NatsServer(data_dir=tmp_path / "nats", port=None, mqtt_port=0, tls=(files.cert, files.key))
    await server.start()
    try:
        assert server.url.startswith("tls://")
        secured = await connect(server.url, "tls-test", tls_ca=str(files.ca))
        await secured.publish("x", b"y")
        await close_quietly(secured)
        with pytest.raises(BrokerUnavailable):                                      # an unknown CA is refused
            await connect(server.url, "no-ca", connect_timeout_s=1)
        device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls-device")
        device.tls_set(ca_certs=str(files.ca))
        connected = threading.Event()
        device.on_connect = lambda *a: connected.set()
        device.connect("127.0.0.1", server.mqtt_port)
        device.loop_start()
        assert connected.wait(10)
        device.disconnect()
        device.loop_stop()
    finally:
        await server.stop()
    port = free_port()
    async with node_factory(k=1):
        bridge = HttpBridge(nc, "n1", prefix=prefix)
        started = asyncio.Event()
        serving_task = asyncio.create_task(bridge.serve("127.0.0.1", port, started, tls=(str(files.cert), str(files.key))))
        await asyncio.wait_for(started.wait(), 10)
        try:
            async with httpx.AsyncClient(verify=str(files.ca)) as https:
                assert (await https.post(f"https://127.0.0.1:{port}/function/echo", content=b"tls")).content == b"tls"
        finally:
            bridge.shutdown()
            await serving_task
            await bridge.stop()


async def test_a_worker_cannot_read_the_replies_meant_for_others(secure):
    """User code holds its worker's identity: subscribing to every reply inbox would show it every
    direct call's output and every control answer in the account (and their inbox names, to forge
    answers to). A worker never asks anything, so it subscribes to no inbox."""
    server, store = secure
    async with Identity(server, store.worker("n1")) as worker, Identity(server, store.service(OPERATOR)) as operator:
        overheard: list[str] = []

        async def note(msg) -> None:
            overheard.append(msg.subject)
        await worker.nc.subscribe("_INBOX.>", cb=note)
        await worker.nc.flush()
        reply = await operator.nc.request(S.config("n1", "get"), b"", timeout=5)   # answered to the operator's inbox
        assert reply.headers[H.STATUS] == "200"
        await worker.nc.flush()
        assert overheard == []
        await wait_until(lambda: any("permissions violation for subscription" in e.lower() for e in worker.errors),
                         timeout_s=5)   # refused, and said so


async def test_p2pfaas_peer_jobs_need_the_invoke_token_unless_p2pfaas_ports_are_open(node_factory, nc, prefix):
    """``POST /peer/function/{fn}`` runs a function as ``/function/{fn}`` does: with
    ``--require-invoke-token`` it must not be the way around the token (a P2PFaaS node sends
    none: only ``p2pfaas_open`` takes its jobs without one)."""
    import base64

    job = {"payload": base64.b64encode(b"sneaked").decode(), "hops": 1}
    machine = {H.USER_AGENT: H.USER_AGENT_MACHINE}
    async with node_factory(k=1):
        async with serving(HttpBridge(nc, "n1", prefix=prefix, operator_token="op-token",
                                      invoke_token="call-token")) as http:
            r = await http.post("/peer/function/echo", json=job, headers=machine)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
            r = await http.post("/peer/function/echo", json=job, headers={**machine, "Authorization": "Bearer call-token"})
            assert r.status_code == 200 and base64.b64decode(r.json()["body"]) == b"sneaked"
        async with serving(HttpBridge(nc, "n1", prefix=prefix, operator_token="op-token", invoke_token="call-token",
                                      p2pfaas_open=True)) as http:
            r = await http.post("/peer/function/echo", json=job, headers=machine)
            assert r.status_code == 200 and base64.b64decode(r.json()["body"]) == b"sneaked"



def counted_before(call_id: str) -> set[str]:
    """The ids an attacker tries first: ``call_id``'s tail read as a counter (decimal or hex, any
    width), one and two steps back."""
    out = set()
    for base, alphabet in ((10, "0123456789"), (16, "0123456789abcdef")):
        tail = len(call_id) - len(call_id.rstrip(alphabet))
        for width in range(1, tail + 1):
            head, count = call_id[:-width], int(call_id[-width:], base)
            out |= {head + (str(count - d) if base == 10 else format(count - d, f"0{width}x"))
                    for d in (1, 2) if count >= d}
    return out


async def test_an_async_result_is_not_read_by_a_caller_who_guesses_its_call_id(node_factory, nc, prefix):
    """``GET /result/{id}`` answers whoever names the id (every HTTP caller is the bridge's one
    client): an id must not be guessable from one's own, or any caller reads the others' results."""
    async with node_factory(k=1), serving(HttpBridge(nc, "n1", prefix=prefix)) as http:
        victim = (await http.post("/async-function/echo", content=b"the victim's secret")).headers[H.CALL_ID]
        mine = (await http.post("/async-function/echo", content=b"mine")).headers[H.CALL_ID]
        async def statuses() -> list[int]:
            return [(await http.get(f"/result/{i}")).status_code for i in (victim, mine)]
        await eventually(statuses, lambda s: s == [200, 200])   # both answered and stored
        assert (await http.get(f"/result/{victim}")).content == b"the victim's secret"   # its owner reads it
        guesses = counted_before(mine)
        leaked = [g for g in guesses if (await http.get(f"/result/{g}")).content == b"the victim's secret"]
        assert victim not in guesses and leaked == [], (victim, mine)


@pytest.mark.parametrize("name", [BRIDGE, CONTROLLER, "node-n1", "http-n1"])
def test_a_device_cannot_take_a_service_name(tmp_path, name):
    """A device named ``bridge`` would get the MQTT bridge's ACL on Mosquitto (read and write
    everything); one named like a NATS service user stops nats-server (user names are unique
    across accounts); ``http-<node>`` is the HTTP bridge's client, whose results are every HTTP
    caller's. Refused, by the CLI too."""
    store = AuthStore(tmp_path / "auth")
    store.service(OPERATOR)   # as `up` leaves it
    with pytest.raises(ValueError, match="taken by"):
        store.device(name)
    cli = subprocess.run([*P2PFAAS, "auth", "device", name, "--data-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "taken by" in cli.stderr and cli.stdout == ""


async def test_a_device_file_naming_a_service_lets_neither_the_impostor_in_nor_the_brokers_down(tmp_path, caplog):
    """devices.json holding a service's name (written by hand, or by an older version): the
    brokers still start, and the impostor is not let in, with a log line saying what to fix."""
    if shutil.which("mosquitto_passwd") is None:
        pytest.fail("mosquitto not installed (.ci/run installs it)")
    store = AuthStore(tmp_path / "auth")
    bridge, dev1 = store.service(BRIDGE), store.device("dev1")
    devices = json.loads((store.directory / "devices.json").read_text())
    (store.directory / "devices.json").write_text(json.dumps({**devices, BRIDGE: "impostor-password"}))
    with caplog.at_level(logging.ERROR, logger="broker.auth"):
        accounts = nats_accounts(store, ["n1"])
        files = mosquitto_files(store, PREFIX, tmp_path / "mosquitto" / "auth")
    server = NatsServer(data_dir=tmp_path / "nats", port=None, accounts=accounts)
    await server.start()   # a duplicate user name would keep it from starting
    await server.stop()
    broker = Mosquitto(data_dir=tmp_path / "mosquitto", port=None, auth=files)
    await broker.start()
    try:
        for user, password, allowed in ((BRIDGE, bridge.password, True), (BRIDGE, "impostor-password", False),
                                        (dev1.user, dev1.password, True)):
            client, state = mqtt_client(broker.port, user, password)
            client.disconnect()
            client.loop_stop()
            assert state["rc"].is_failure is not allowed, (user, password)
    finally:
        await broker.stop()
    assert f"device {BRIDGE!r}" in caplog.text and "devices.json" in caplog.text   # what to fix


async def test_on_mosquitto_a_device_cannot_throw_the_mqtt_bridge_off(tmp_path):
    """MQTT client ids are not tied to users: a device connecting with the MQTT bridge's client id
    (it was ``p2pfaas-bridge-<prefix>``, easily guessed) threw the bridge off and took over its
    session -- every device's requests stopped. In a secure stack the id carries a digest of the
    bridge's password: stable across restarts, unknown to devices."""
    if shutil.which("mosquitto_passwd") is None:
        pytest.fail("mosquitto not installed (.ci/run installs it)")
    from broker.mqtt_client import default_client_id

    store = AuthStore(tmp_path / "auth")
    bridge, dev1 = store.service(BRIDGE), store.device("dev1")
    client_id = mqtt_bridge_client_id(store, PREFIX)
    assert client_id == mqtt_bridge_client_id(AuthStore(tmp_path / "auth"), PREFIX)   # stable
    assert client_id != mqtt_bridge_client_id(AuthStore(tmp_path / "other"), PREFIX)   # per stack
    assert bridge.password not in client_id and len(client_id) <= 64
    broker = Mosquitto(data_dir=tmp_path / "mosquitto", port=None,
                       auth=mosquitto_files(store, PREFIX, tmp_path / "mosquitto" / "auth"))
    await broker.start()
    dropped: list[str] = []
    clients = []

    def connect_as(creds: Credentials, cid: str) -> None:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, clean_session=False)
        client.username_pw_set(creds.user, creds.password)
        connected = threading.Event()
        client.on_connect = lambda *args: connected.set()
        client.on_disconnect = lambda c, u, flags, reason, props: dropped.append(creds.user)
        client.reconnect_delay_set(60, 60)   # no reconnection fight within the test
        clients.append(client)
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        assert connected.wait(10)

    try:
        connect_as(bridge, client_id)
        for guess in (f"p2pfaas-bridge-{PREFIX}", default_client_id(PREFIX), mqtt_bridge_client_id(None, PREFIX)):
            connect_as(dev1, guess)
        await asyncio.sleep(1.0)   # a takeover disconnects the first at once
        assert BRIDGE not in dropped, dropped
    finally:
        for client in clients:
            client.disconnect()
            client.loop_stop()
        await broker.stop()
