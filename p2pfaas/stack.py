"""The stack behind ``p2pfaas up``: brokers, nodes, bridges and the controller, each a supervised
process; a busy default port is replaced by a free one, and said."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import stat
import sys
import time

import orjson

from broker import handoff
from broker.auth import BRIDGE, CONTROLLER, OPERATOR, AuthStore, AuthStoreError, mqtt_bridge_client_id
from broker.permissions import mosquitto_files, nats_accounts
from broker.edge import PING_INTERVAL, inbox_prefix, leaf_remote
from broker.embedded import Mosquitto, NatsServer, choose_port
from broker.handoff import SECRET_NAMES
from broker.secrets import KEY_NAME as SECRETS_KEY
from broker.mqtt_client import mqtt_accepts
from broker.lifecycle import hold_data_dir, still_wanted
from broker.tls import TlsFiles, ensure_certificates
from controller.policies import resolve_policy
from controller.scenario import load_scenario
from nodes.sandbox import decide as decide_sandbox
from p2pfaas.parts import BRIDGE_NATS_ENV
from p2pfaas.stack_settings import FARM_FUNCTION, FARM_POOL, Endpoints, StackSettings
from p2pfaas.supervisor import EXIT_NEEDS_FIX, ChildSpec, Supervisor

log = logging.getLogger(__name__)

# nats-server's log when a stream could not write (disk full); the error stays until a restart
STORE_ERRORS = (b"Critical write error", b"failed to store a msg")
HEAL_FREE_BYTES = 16 * 1024 * 1024   # free space on the store's disk before nats-server is restarted
HEAL_PERIOD_S = 2.0
DEVICES_CHECKED = 8        # new devices whose first connection is tried after a reload (the rest follow it)
LET_IN_TIMEOUT_S = 10.0


class Stack:
    """Brokers first, then the nodes (in parallel), the bridges and the controller; stopped in reverse.
    The data dir's lock keeps a second ``up`` from ending a live one's processes (docs/architecture.md)."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.endpoints = Endpoints()
        self.supervisor = Supervisor(settings.data_dir / "run", settings.data_dir / "logs")
        self.node_ids: list[str] = []
        self.nats_server: NatsServer | None = None
        self.mosquitto: Mosquitto | None = None
        self.auth: AuthStore | None = None
        self.tls: TlsFiles | None = None
        self._watch: asyncio.Task | None = None
        self._heal: asyncio.Task | None = None
        self._lock: int | None = None   # the data dir's lock, held from start to stop

    async def start(self) -> Endpoints:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self.endpoints

    def _cli(self, *args: str) -> list[str]:
        argv = [sys.executable, "-m", "p2pfaas.cli", *args]
        return [*argv, "--verbose"] if log.isEnabledFor(logging.INFO) else argv

    async def _start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        ep, sup = self.endpoints, self.supervisor
        self._lock = hold_data_dir(s.data_dir)   # DataDirInUse while another up runs here: its pid files name live parts
        try:   # secrets, logs and stores: none of it for workers run as another user
            os.chmod(s.data_dir, 0o700)
        except PermissionError:   # someone else's directory we may write to: its own mode stands
            ep.notes.append(f"{s.data_dir} is not ours: its mode stays {stat.filemode(s.data_dir.stat().st_mode)}; "
                            "keep it closed to other users (docs/security.md)")
        strays = await asyncio.to_thread(sup.end_strays)
        if strays:
            ep.notes.append(f"ended {len(strays)} process(es) left in {s.data_dir} by a previous run")
        self.auth = store = AuthStore(s.data_dir / "auth") if s.secure else None
        if store is not None:
            ep.notes.append(f"identities and tokens in {store.directory}: `p2pfaas auth operator`, "
                            "`p2pfaas auth device NAME` (docs/security.md)")
        if s.tls:
            self.tls = ensure_certificates(s.data_dir / "tls", [s.host])
            ep.notes.append(f"TLS: clients verify servers against {self.tls.ca}")
        tls_pair = (self.tls.cert, self.tls.key) if self.tls else None
        seen = store.changed_at() if store is not None else 0.0   # what the brokers' files below hold
        nats_url = s.nats_url
        if nats_url is None:
            self.nats_server = server = NatsServer(tls=tls_pair,
                data_dir=s.data_dir / "nats", port=s.nats_port, host=s.host,
                mqtt_port=s.mqtt_port if s.mqtt == "nats" and not s.mqtt_url else None,
                accounts=nats_accounts(store, s.node_ids) if store is not None else None)
            if s.edge is not None:   # a leaf of the hub: its streams its own, its NATS clients this machine's
                server.host, server.mqtt_host, server.server_name = "127.0.0.1", s.host, s.edge.device
                server.jetstream_domain, server.ping_interval = s.edge.device, PING_INTERVAL
                server.leaf_remotes = leaf_remote(s.edge, s.data_dir / "edge")
            argv = log_to_stderr(server.configure())
            await sup.start(ChildSpec("nats-server", argv, ready="port", ports=server.ports, ready_timeout_s=30,
                                      stop_timeout_s=10))
            ep.notes += server.notes
            nats_url = server.url
            self._heal = asyncio.create_task(self._heal_store(server), name="jetstream-heal")
            if server.mqtt_port is not None:
                scheme = "mqtts" if s.tls else "mqtt"
                ep.mqtt_url, ep.mqtt_via = f"{scheme}://{s.host}:{server.mqtt_port}", "nats-server MQTT listener"
        ep.nats_url = nats_url
        mqtt_url = s.mqtt_url
        if mqtt_url is None and s.mqtt == "mosquitto":
            auth = mosquitto_files(store, s.prefix, s.data_dir / "mosquitto" / "auth") if store is not None else None
            self.mosquitto = mosquitto = Mosquitto(data_dir=s.data_dir / "mosquitto", port=s.mqtt_port, host=s.host,
                                                   auth=auth, tls=tls_pair)
            argv = mosquitto.configure()
            await sup.start(ChildSpec("mosquitto", argv, ready="port", ports=mosquitto.ports, ready_timeout_s=20,
                                      stop_timeout_s=10))
            ep.notes += mosquitto.notes
            mqtt_url = mosquitto.url
        if store is not None:   # from now on: a device enrolled while the rest starts is let in too
            self._watch = asyncio.create_task(self._reload_on_new_identities(store, seen, mqtt_url or ep.mqtt_url),
                                              name="auth-watch")

        # HTTP ports first: each node advertises its bridge's URL in its heartbeats (GET /list)
        ports: list[int] = []
        p2pfaas_ports: list[tuple[int, int]] = []   # P2PFaaS layout: (discovery, learner) per node
        for i in range(s.node_count):
            host = s.node_host(i)
            # 0: a free port for every node (choose_port picks one)
            wanted = s.http_port if s.p2pfaas_ports or not s.http_port else s.http_port + i
            port, note = choose_port(wanted, host, set() if s.p2pfaas_ports else set(ports))
            ports.append(port)
            if note:
                ep.notes.append(f"HTTP node {i + 1} ({host}): {note}")
            if s.p2pfaas_ports:
                discovery, d_note = choose_port(s.discovery_port, host, {port})
                learner, l_note = choose_port(s.learner_port, host, {port, discovery})
                p2pfaas_ports.append((discovery, learner))
                ep.notes += [f"node {i + 1} ({host}) {what}: {n}; P2PFaaS clients expect the standard port"
                             for what, n in (("discovery", d_note), ("learner", l_note)) if n]
        web = "https" if s.tls else "http"
        settings = s.node_settings(nats_url, [f"{web}://{s.node_host(i)}:{p}" for i, p in enumerate(ports)])
        if s.runtime == "process":   # what the workers' sandbox leaves open; WorkerUserError (one line) for a bad user
            ep.notes += decide_sandbox(settings[0]).notes
        run_dir = s.data_dir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        specs = []
        for i, (node, port) in enumerate(zip(settings, ports)):
            path = run_dir / f"node-{node.node_id}.json"
            path.write_text(node.model_dump_json())
            # each node serves its HTTP bridge from its own process (docs/data-plane.md, "Processes")
            argv = ["node", "--settings", str(path), "--http-host", s.node_host(i), "--http-port", str(port),
                    "--http-processes", str(s.http_processes)]
            if s.p2pfaas_ports:
                argv += ["--discovery-port", str(p2pfaas_ports[i][0]), "--learner-port", str(p2pfaas_ports[i][1])]
            specs.append(ChildSpec(f"node-{node.node_id}", self._cli(*argv),
                                   **self._identity(node=node.node_id, http=True), stop_timeout_s=30,
                                   fix_exit_code=EXIT_NEEDS_FIX, watch=[node.node_dir]))   # a broken file there
            self.node_ids.append(node.node_id)
        await asyncio.gather(*(sup.start(spec) for spec in specs))
        for i, (node_id, port) in enumerate(zip(self.node_ids, ports)):
            ep.http[node_id] = f"{web}://{s.node_host(i)}:{port}"
            if s.p2pfaas_ports:
                ep.discovery[node_id] = f"{web}://{s.node_host(i)}:{p2pfaas_ports[i][0]}"
                ep.learner[node_id] = f"{web}://{s.node_host(i)}:{p2pfaas_ports[i][1]}"

        if mqtt_url is not None:
            await sup.start(ChildSpec("mqtt-bridge", self._cli(
                "bridge", "mqtt", "--nats-url", nats_url, "--mqtt-url", mqtt_url, "--prefix", s.prefix,
                "--client-id", mqtt_bridge_client_id(self.auth, s.prefix), "--max-payload-bytes", str(s.max_payload_bytes)),
                **self._identity(BRIDGE, mqtt=True)))
            ep.mqtt_url, ep.mqtt_via = mqtt_url, "Mosquitto + p2pfaas MQTT bridge"
        if s.controller_policy is not None:
            await self._start_controller(nats_url)
        (s.data_dir / "endpoints.json").write_bytes(orjson.dumps({
            "nats_url": ep.nats_url, "mqtt_url": ep.mqtt_url, "http": ep.http, "prefix": s.prefix,
            "discovery": ep.discovery, "learner": ep.learner,
        }, option=orjson.OPT_INDENT_2))

    async def _start_controller(self, nats_url: str) -> None:
        s = self.settings
        scenario = load_scenario(s.farm_scenario)
        _, name, note = await asyncio.to_thread(resolve_policy, s.controller_policy or "auto", scenario, s.models_dir)
        node = self.node_ids[0]
        await self.supervisor.start(ChildSpec("controller", self._cli(
            "controller", "--node", node, "--pool", FARM_POOL, "--policy", s.controller_policy or "auto",
            "--scenario", s.farm_scenario, "--models-dir", str(s.models_dir), "--nats-url", nats_url,
            "--prefix", s.prefix, "--functions"), **self._identity(CONTROLLER)))
        if note:
            self.endpoints.notes.append(f"controller: {note}")
        self.endpoints.controller = (f"{node}/{FARM_POOL} (function {FARM_FUNCTION}) scaled by {name}, "
                                     f"scenario {scenario.name}, {scenario.workers.min}-{scenario.workers.max} workers; "
                                     "functions with a pool of their own by their deployment's policy")

    def _identity(self, user: str | None = None, *, node: str | None = None, http: bool = False,
                  mqtt: bool = False) -> dict[str, dict[str, str]]:
        """A part's identity as ChildSpec arguments: ``env`` (no secret) and ``secrets`` (handed over)."""
        s, store = self.settings, self.auth
        env: dict[str, str] = {}
        if s.edge is not None:   # replies cross the hub only to the inboxes of the device they are meant for
            env["P2PFAAS_INBOX_PREFIX"] = inbox_prefix(s.edge.device)
        # what up was given by hand (a foreign broker's identity, say), unless the stack has its own
        secrets = {name: value for name in SECRET_NAMES if (value := handoff.get(name))}
        if self.tls is not None:
            env["P2PFAAS_TLS_CA"] = str(self.tls.ca)
            if http:
                env.update(P2PFAAS_TLS_CERT=str(self.tls.cert), P2PFAAS_TLS_KEY=str(self.tls.key))
        if http:
            env["P2PFAAS_CALLBACK_HOSTS"] = ",".join(s.callback_hosts)
            if s.loopback_hosts or s.p2pfaas_open:   # P2PFaaS's layout: its discovery and learner ports as open as in P2PFaaS
                env["P2PFAAS_P2PFAAS_OPEN"] = "1"
        if store is None:
            return {"env": env, "secrets": secrets}
        if node is not None:
            creds, workers = store.node(node), store.worker(node)
            nats_secrets = dict(P2PFAAS_WORKER_NATS_USER=workers.user, P2PFAAS_WORKER_NATS_PASSWORD=workers.password)
            secrets[SECRETS_KEY] = store.secrets_key()   # it opens the deployment's secrets, whatever broker
            if http:   # the bridge in the node's process keeps its own identity (p2pfaas.parts.BRIDGE_NATS_ENV)
                bridge = store.service(BRIDGE)
                nats_secrets.update({f"{BRIDGE_NATS_ENV}_USER": bridge.user, f"{BRIDGE_NATS_ENV}_PASSWORD": bridge.password})
        else:
            creds = store.service(user or OPERATOR)
            nats_secrets = {}
        if self.nats_server is not None:   # our server knows these users; a foreign one (--nats-url) its own
            secrets.update(nats_secrets, P2PFAAS_NATS_USER=creds.user, P2PFAAS_NATS_PASSWORD=creds.password)
        if http:
            secrets["P2PFAAS_OPERATOR_TOKEN"] = store.operator_token()
            if s.require_invoke_token:
                secrets["P2PFAAS_INVOKE_TOKEN"] = store.invoke_token()
        if mqtt:
            secrets.update(P2PFAAS_MQTT_USER=creds.user, P2PFAAS_MQTT_PASSWORD=creds.password)
        return {"env": env, "secrets": secrets}

    async def _reload_on_new_identities(self, store: AuthStore, seen: float, mqtt_url: str | None,
                                        period_s: float = 0.25) -> None:
        """A device or node added with ``p2pfaas auth`` while we run: the brokers' configuration is
        rewritten and reloaded (SIGHUP; nobody is disconnected); once a new device's MQTT connection
        is accepted, the store says so (``auth device`` waits for it)."""
        known = set(store.devices())
        store.mark_applied(seen)
        while True:
            still_wanted()
            await asyncio.sleep(period_s)
            changed = store.changed_at()
            if changed <= seen:
                continue
            seen = changed
            try:
                devices = store.devices()
            except AuthStoreError as exc:   # broken by hand: keep what the brokers have
                log.error("identities not reloaded: %s", exc)
                continue
            if self.nats_server is not None:
                self.nats_server.reconfigure(nats_accounts(store, self.settings.node_ids))
                self.supervisor.signal("nats-server", signal.SIGHUP)
            if self.mosquitto is not None:
                mosquitto_files(store, self.settings.prefix, self.settings.data_dir / "mosquitto" / "auth")
                self.supervisor.signal("mosquitto", signal.SIGHUP)
            new = {name: password for name, password in devices.items() if name not in known}
            if mqtt_url and new:
                await asyncio.gather(*(self._until_let_in(mqtt_url, name, password)
                                       for name, password in sorted(new.items())[:DEVICES_CHECKED]))
            known = set(devices)
            store.mark_applied(seen)
            (log.info if new else log.debug)("identities changed: brokers reloaded%s",
                                             f" (new devices: {', '.join(sorted(new))})" if new else "")

    async def _until_let_in(self, mqtt_url: str, user: str, password: str) -> None:
        """Wait (bounded) until the MQTT broker accepts ``user``: its reload is done."""
        ca = str(self.tls.ca) if self.tls is not None else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LET_IN_TIMEOUT_S
        while loop.time() < deadline:
            if await asyncio.to_thread(mqtt_accepts, mqtt_url, user, password, ca):
                return
            await asyncio.sleep(0.05)
        log.warning("device %s: the MQTT broker still refuses it %g s after the reload", user, LET_IN_TIMEOUT_S)

    async def _heal_store(self, server: NatsServer, period_s: float = HEAL_PERIOD_S) -> None:
        """nats-server keeps failing a stream's writes after its disk was full, even once there is
        room again: when its log says a write failed and the disk has room, it is restarted on the
        same store; clients reconnect and carry on (docs/security.md, "A full disk")."""
        path, store = self.supervisor.log_dir / "nats-server.log", server.data_dir
        offset = path.stat().st_size if path.exists() else 0
        failing_since: float | None = None
        while True:
            still_wanted()
            await asyncio.sleep(period_s)
            try:
                size = path.stat().st_size
                if size < offset:   # a new log
                    offset = 0
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(size - offset)
                offset = size
                free = shutil.disk_usage(store).free
            except OSError:
                continue
            if failing_since is None and any(e in chunk for e in STORE_ERRORS):
                failing_since = time.monotonic()
                log.error("nats-server could not write its store (disk full?); it is restarted once the disk "
                          "has %d MiB free (now %d MiB)", HEAL_FREE_BYTES >> 20, free >> 20)
            if failing_since is None or free < HEAL_FREE_BYTES:
                continue
            note = (f"nats-server restarted: its store failed writes (disk full) and the disk has "
                    f"{free >> 20} MiB free again ({time.monotonic() - failing_since:.0f} s after the first failure)")
            log.warning(note)
            self.endpoints.notes.append(note)
            failing_since = None
            self.supervisor.signal("nats-server", signal.SIGTERM)   # the supervisor starts it again
            await asyncio.sleep(period_s)
            offset = path.stat().st_size if path.exists() else 0

    async def stop(self) -> None:
        """Controller and MQTT bridge first (no new work), then the nodes with their HTTP bridges
        (they finish theirs), then the brokers; every step bounded."""
        for task in (self._watch, self._heal):
            if task is not None:
                task.cancel()
        order = ["controller", "mqtt-bridge", *[f"node-{n}" for n in self.node_ids], "mosquitto", "nats-server"]
        await self.supervisor.stop_all(order)
        if self._lock is None:   # it never started here: the endpoints file is another up's
            return
        try:
            (self.settings.data_dir / "endpoints.json").unlink(missing_ok=True)
        finally:
            os.close(self._lock)
            self._lock = None

    async def __aenter__(self) -> "Stack":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def log_to_stderr(argv: list[str]) -> list[str]:
    """nats-server's command line without its ``-l FILE``: it logs on stderr, which the supervisor
    appends to DATA_DIR/logs/nats-server.log with whatever it prints before its log is open."""
    if "-l" not in argv:
        return argv
    i = argv.index("-l")
    return argv[:i] + argv[i + 2:]
