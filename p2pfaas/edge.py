"""Several machines (docs/edge.md): the hub is a nats-server that devices reach over mutual TLS as
leaf nodes, one leaf user per invited device (``<hub-dir>/auth``). An invitation or a revocation
is applied while the hub runs: its configuration is rewritten and reloaded (nobody is
disconnected), and a revoked device's live link is dropped."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from broker.auth import OPERATOR, SYSTEM, AuthStore, AuthStoreError
from broker.permissions import hub_accounts
from broker.edge import LEAF_PORT, PING_INTERVAL, Invitation
from broker.embedded import NatsServer
from broker.lifecycle import cancel_and_wait, data_dir_held, hold_data_dir, still_wanted, write_whole
from broker.subjects import check_node
from broker.tls import TlsFiles, client_certificate, ensure_certificates
from p2pfaas.stack import log_to_stderr
from p2pfaas.supervisor import ChildSpec, Supervisor

log = logging.getLogger(__name__)

HUB_FILE = "hub.json"          # a running hub's endpoints (invite reads its leaf URLs)
WATCH_PERIOD_S = 0.25
APPLY_TIMEOUT_S = 20.0         # invite / revoke wait this long for a running hub to apply them
KICK_TIMEOUT_S = 2.0


@dataclass
class HubSettings:
    data_dir: Path = Path("hub")
    host: str = "0.0.0.0"            # where devices reach it (its leaf listener)
    names: list[str] = field(default_factory=list)   # addresses devices dial (its certificate names them)
    leaf_port: int = LEAF_PORT
    nats_port: int = 4222            # the operator's own client port (127.0.0.1)


class Hub:
    """``p2pfaas hub``: one supervised nats-server and the watch that applies invitations."""

    def __init__(self, settings: HubSettings) -> None:
        self.settings = settings
        self.supervisor = Supervisor(settings.data_dir / "run", settings.data_dir / "logs")
        self.store = AuthStore(settings.data_dir / "auth")
        self.server: NatsServer | None = None
        self.tls: TlsFiles | None = None
        self.notes: list[str] = []
        self._lock: int | None = None
        self._watch: asyncio.Task | None = None

    @property
    def leaf_urls(self) -> list[str]:
        assert self.server is not None
        return [f"tls://{name}:{self.server.leaf_port}" for name in self.settings.names]

    async def start(self) -> "Hub":
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(s.data_dir, 0o700)
        self._lock = hold_data_dir(s.data_dir)
        strays = await asyncio.to_thread(self.supervisor.end_strays)
        if strays:
            self.notes.append(f"ended {len(strays)} process(es) left in {s.data_dir} by a previous run")
        self.store.service(OPERATOR)
        self.store.service(SYSTEM)
        self.tls = ensure_certificates(s.data_dir / "tls", s.names)
        seen = self.store.changed_at()
        self.server = server = NatsServer(
            data_dir=s.data_dir / "nats", port=s.nats_port, host="127.0.0.1", server_name="hub",
            jetstream=False, tls=(str(self.tls.cert), str(self.tls.key)), leaf_port=s.leaf_port, leaf_host=s.host,
            leaf_ca=str(self.tls.ca), ping_interval=PING_INTERVAL, accounts=hub_accounts(self.store), monitor_port=0)
        argv = log_to_stderr(server.configure())
        await self.supervisor.start(ChildSpec("nats-server", argv, ready="port", ports=server.ports,
                                              ready_timeout_s=30, stop_timeout_s=10))
        self.notes += server.notes
        self._watch = asyncio.create_task(self._apply_changes(seen), name="hub-watch")
        write_whole(s.data_dir / HUB_FILE, orjson.dumps({
            "nats_url": server.url, "leaf_urls": self.leaf_urls, "ca": str(self.tls.ca),
            "monitor": f"http://127.0.0.1:{server.monitor_port}"}, option=orjson.OPT_INDENT_2))

    async def _apply_changes(self, seen: float) -> None:
        """Invitations and revocations while the hub runs: configuration rewritten and reloaded,
        a revoked device's live link dropped, then ``auth/applied.json`` says so."""
        revoked = self.store.revoked()
        self.store.mark_applied(seen)
        while True:
            still_wanted()
            await asyncio.sleep(WATCH_PERIOD_S)
            changed = self.store.changed_at()
            if changed <= seen:
                continue
            seen = changed
            try:
                accounts = hub_accounts(self.store)
                now_revoked = self.store.revoked()
            except AuthStoreError as exc:   # broken by hand: the server keeps what it has
                log.error("hub identities not reloaded: %s", exc)
                continue
            assert self.server is not None
            self.server.reconfigure(accounts)
            self.supervisor.signal("nats-server", signal.SIGHUP)
            for device in sorted(d for d, at in now_revoked.items() if revoked.get(d) != at):
                await self._drop(device)
            revoked = now_revoked
            self.store.mark_applied(seen)
            log.info("hub identities reloaded")

    async def _drop(self, device: str) -> None:
        """A reload refuses the revoked device's next connection but keeps its live one: drop it
        (nats-server's system account kicks the leaf connection named after the device)."""
        from broker.connection import close_quietly, connect

        assert self.server is not None and self.tls is not None
        sys_user = self.store.service(SYSTEM)
        try:
            nc = await connect(self.server.url, "hub-sys", credentials=(sys_user.user, sys_user.password),
                               tls_ca=str(self.tls.ca), connect_timeout_s=KICK_TIMEOUT_S)
        except Exception as exc:
            log.error("revoked device %s: its link may stay up until it drops (%s)", device, exc)
            return
        try:
            deadline = time.monotonic() + KICK_TIMEOUT_S * 2
            while time.monotonic() < deadline:   # the reload is asynchronous: look until it is gone
                reply = orjson.loads((await nc.request("$SYS.REQ.SERVER.PING.LEAFZ", b"", timeout=KICK_TIMEOUT_S)).data)
                server_id = reply.get("server", {}).get("id", "")
                links = [leaf for leaf in (reply.get("data") or {}).get("leafs") or [] if leaf.get("name") == device]
                if not links:
                    log.info("revoked device %s is off the hub", device)
                    return
                for leaf in links:
                    await nc.request(f"$SYS.REQ.SERVER.{server_id}.KICK", orjson.dumps({"cid": leaf["id"]}),
                                     timeout=KICK_TIMEOUT_S)
                await asyncio.sleep(0.05)
            log.error("revoked device %s: its link is still up after %g s", device, KICK_TIMEOUT_S * 2)
        except Exception as exc:
            log.error("revoked device %s: its link could not be dropped: %r", device, exc)
        finally:
            await close_quietly(nc)

    async def stop(self) -> None:
        await cancel_and_wait(self._watch)
        await self.supervisor.stop_all(["nats-server"])
        if self._lock is not None:
            (self.settings.data_dir / HUB_FILE).unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None


def read_hub(data_dir: Path) -> dict:
    try:
        return orjson.loads((data_dir / HUB_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}


def invite(data_dir: Path, device: str, group: str, hub_urls: list[str]) -> Invitation:
    """An invitation for ``device`` (its leaf identity and a client certificate), returned once a
    running hub lets it in. ``hub_urls``: where the device dials (default: the running hub's)."""
    check_node(device)
    store = AuthStore(data_dir / "auth")
    urls = hub_urls or read_hub(data_dir).get("leaf_urls") or []
    if not urls:
        raise ValueError(f"no running hub in {data_dir} to take its address from: give --hub-url tls://HOST:{LEAF_PORT}")
    tls = ensure_certificates(data_dir / "tls", [urlsplit(u).hostname or "" for u in urls])
    credentials = store.invite(device, group)
    cert, key = client_certificate(tls, device)
    _until_applied(data_dir, store, store.changed_at())
    return Invitation(device=device, group=group, hubs=urls, leaf_user=credentials.user,
                      leaf_password=credentials.password, ca=tls.ca.read_text(), cert=cert.decode(), key=key.decode())


def revoke(data_dir: Path, device: str) -> bool:
    """Forget ``device`` at the hub (False: it was not invited); returns once a running hub has
    dropped its link."""
    store = AuthStore(data_dir / "auth")
    if not store.revoke(check_node(device)):
        return False
    _until_applied(data_dir, store, store.changed_at())
    return True


def _until_applied(data_dir: Path, store: AuthStore, changed: float) -> None:
    deadline = time.monotonic() + APPLY_TIMEOUT_S
    while data_dir_held(data_dir) and store.applied_at() < changed:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the hub running on {data_dir} has not applied the change within {APPLY_TIMEOUT_S:g} s "
                               f"(its log: {data_dir / 'logs' / 'nats-server.log'})")
        time.sleep(0.05)


def address_towards(url: str) -> str:
    """This machine's address on the way to ``url``'s host (what a device advertises to its peers)."""
    host = urlsplit(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, urlsplit(url).port or LEAF_PORT))   # UDP: nothing is sent
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"
