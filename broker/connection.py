"""Connecting to NATS with the options every p2pfaas component wants; the connection is a
:class:`~broker.fastpath.NatsClient` (nats-py's, with the request path's overrides)."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import ssl
import weakref
from typing import Callable, Literal, Mapping

from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from broker import handoff
from broker.errors import BrokerUnavailable, NotPermitted
from broker.fastpath import NatsClient
from broker.header_blocks import HeaderBlock
from broker.header_blocks import header_block, header_text   # noqa: F401 (re-exported)
from broker.settings import broker_settings

log = logging.getLogger(__name__)

TLS_CA_PEM = "P2PFAAS_TLS_CA_PEM"   # the CA certificate itself, for a process that cannot read its file

_REFUSED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)
Event = Literal["publish_refused", "disconnected", "reconnected"]
# connection -> event -> who wants to hear about it
_listeners: "weakref.WeakKeyDictionary[Client, dict[str, list[Callable[..., None]]]]" = weakref.WeakKeyDictionary()


# A first connect turned away (nothing listens, a refused identity) gives up after this many seconds;
# None: it retries until its deadline, as parts of `up` do while their broker (re)starts.
GIVE_UP_TURNED_AWAY_S: float | None = None


Handler = Callable[[str, str, bytes, Mapping[str, str]], None]   # (subject, reply, data, headers)
_NO_HEADERS: Mapping[str, str] = {}


async def listen(nc: Client, subject: str, handler: Handler, queue: str = "") -> Subscription:
    """``handler(subject, reply, data, headers)`` for each message, from the read loop: never block."""
    if isinstance(nc, NatsClient):
        return await nc.subscribe_lean(subject, lambda subj, reply, data, block: handler(
            subj, reply, data, HeaderBlock(block) if block else _NO_HEADERS), queue=queue)

    async def on_msg(msg: Msg) -> None:
        handler(msg.subject, msg.reply, msg.data, msg.headers or _NO_HEADERS)
    return await nc.subscribe(subject, queue=queue, cb=on_msg)


def on_event(nc: Client, event: Event, listener: Callable[..., None]) -> Callable[[], None]:
    """Call ``listener`` on ``event`` of a connection; returns the function that removes it."""
    listeners = _listeners.setdefault(nc, {}).setdefault(event, [])
    listeners.append(listener)
    return lambda: listener in listeners and listeners.remove(listener)


def on_publish_refused(nc: Client, listener: Callable[[str], None]) -> Callable[[], None]:
    """Call ``listener(subject)`` whenever the broker refuses a publish of ``nc``."""
    return on_event(nc, "publish_refused", listener)


def _notify(nc: Client | None, event: Event, *args: str) -> None:
    if nc is None:
        return
    for listener in list(_listeners.get(nc, {}).get(event, ())):
        try:
            listener(*args)
        except Exception:  # one listener's bug does not keep the others from hearing it
            log.exception("%s listener failed", event)


def _publish_refused(nc: Client | None, exc: Exception) -> None:
    match = _REFUSED.search(str(exc))
    if match is not None:
        _notify(nc, "publish_refused", match.group(1))


async def request(nc: Client, subject: str, payload: bytes = b"", *, timeout_s: float,
                  headers: dict[str, str] | None = None) -> Msg:
    """``nc.request`` that fails at once (:class:`NotPermitted`) when the broker refuses the publish."""
    loop = asyncio.get_running_loop()
    refused: asyncio.Future[None] = loop.create_future()

    def listener(refused_subject: str) -> None:
        if refused_subject == subject and not refused.done():
            refused.set_exception(NotPermitted(f"the broker does not permit this service to publish to {subject}"))

    remove = on_publish_refused(nc, listener)
    asking = asyncio.ensure_future(nc.request(subject, payload, timeout=timeout_s, headers=headers))
    try:
        await asyncio.wait((asking, refused), return_when=asyncio.FIRST_COMPLETED)
        if asking.done():
            return asking.result()
        asking.cancel()
        return refused.result()   # raises NotPermitted
    finally:
        remove()
        if not refused.done():
            refused.cancel()
        if not asking.done():
            asking.cancel()


def credentials_from_env(prefix: str = "P2PFAAS_NATS") -> tuple[str, str] | None:
    """(user, password) handed over at start (:mod:`broker.handoff`) or in the env; else None."""
    user, password = handoff.get(f"{prefix}_USER"), handoff.get(f"{prefix}_PASSWORD")
    return (user, password) if user and password else None


async def connect(url: str | list[str], name: str, *, connect_timeout_s: float = 5.0,
                  credentials: tuple[str, str] | None = None, tls_ca: str | None = None) -> Client:
    """Connect (reconnecting forever afterwards); BrokerUnavailable if the first attempt fails within
    2 x ``connect_timeout_s`` (or :data:`GIVE_UP_TURNED_AWAY_S` once turned away). ``url`` may list a
    cluster's servers; ``tls_ca`` (default ``P2PFAAS_TLS_CA``) is the CA file, else the PEM handed as
    ``P2PFAAS_TLS_CA_PEM`` (a worker, which may not read the data dir)."""

    credentials = credentials or credentials_from_env()
    settings = broker_settings()
    tls_ca = tls_ca or settings.tls_ca
    options: dict = {}
    if credentials:  # options, not the URL: nats-py uses them for the servers it discovers too
        options.update(user=credentials[0], password=credentials[1])
    if tls_ca:
        options["tls"] = ssl.create_default_context(cafile=tls_ca)
    elif ca_pem := handoff.get(TLS_CA_PEM):
        options["tls"] = ssl.create_default_context(cadata=ca_pem)
    if settings.inbox_prefix:
        options["inbox_prefix"] = settings.inbox_prefix

    connection: list[Client] = []
    first_error: list[Exception] = []   # the first connect retries until its deadline: its last error says why
    refusal: list[Exception] = []       # ... unless the broker turned us away: that says it better
    loop = asyncio.get_running_loop()
    started, patience = loop.time(), GIVE_UP_TURNED_AWAY_S
    turned_away: asyncio.Future[None] = loop.create_future()

    async def on_error(exc: Exception) -> None:
        if not connection:
            first_error[:] = [exc]
            if _turned_away(exc):
                refusal[:] = [exc]
            log.debug("nats %s: %s", name, exc)
            # nats-server closes the connection after its -ERR: a retry may see only the reset
            if (patience is not None and refusal and loop.time() - started >= patience
                    and (refusal[0] is exc or isinstance(exc, (ConnectionResetError, BrokenPipeError)))
                    and not turned_away.done()):
                turned_away.set_result(None)
            return
        log.warning("nats %s: %s", name, exc)
        _publish_refused(connection[0], exc)

    async def on_disconnect() -> None:
        log.info("nats %s: disconnected", name)
        _notify(connection[0] if connection else None, "disconnected")

    async def on_reconnect() -> None:
        log.info("nats %s: reconnected", name)
        _notify(connection[0] if connection else None, "reconnected")

    # nats-py retries a failed first connect forever when reconnects are on: bound it
    nc = NatsClient()
    connecting = asyncio.ensure_future(nc.connect(
        url,
        name=name,
        connect_timeout=connect_timeout_s,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        pending_size=64 * 1024 * 1024,
        **options,
    ))
    try:
        await asyncio.wait((connecting, turned_away), timeout=connect_timeout_s * 2,
                           return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():
            connecting.cancel()
            await asyncio.wait((connecting,))   # it has ended before we go on, as with wait_for
            raise TimeoutError
        connecting.result()
    except Exception as exc:  # nats raises several unrelated types here
        last = first_error[0] if first_error else exc
        if refusal and isinstance(last, (ConnectionResetError, BrokenPipeError)):
            last = refusal[0]
        reason = str(last) or f"no answer within {2 * connect_timeout_s:g} s"
        raise BrokerUnavailable(f"cannot connect to NATS at {url}: {reason}") from exc
    finally:
        connecting.cancel()   # we were cancelled while it connected (nothing, when it is done)
        turned_away.cancel()
    connection.append(nc)
    return nc


def _turned_away(exc: Exception) -> bool:
    """Asking again at once will not change it: refused, unknown host, refused identity."""
    return (isinstance(exc, (ConnectionRefusedError, socket.gaierror, nats_errors.AuthorizationError))
            or "authorization violation" in str(exc).lower())


async def close_quietly(nc: Client, *subs, timeout_s: float = 5.0) -> None:
    """Unsubscribe and drain within ``timeout_s``; a broker already gone is no error at shutdown."""
    if nc.is_closed:
        return
    if nc.is_connected:
        try:
            for sub in subs:
                await sub.unsubscribe()
            async with asyncio.timeout(timeout_s):
                await nc.drain()
            return
        except Exception as exc:
            log.debug("draining %s: %s", nc, exc)
    try:
        async with asyncio.timeout(timeout_s):
            await nc.close()
    except Exception as exc:  # e.g. ConnectionResetError from a broker gone meanwhile: closed all the same
        log.debug("closing %s: %r", nc, exc)
