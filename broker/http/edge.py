"""The HTTP edge in front of every bridge port (docs/security.md, "HTTP edge"): per-client and per-process
connection slots (beyond: 503 before a byte is read), bounded request heads (431/414), cut slow
connections; each refusal counted by reason and logged at most every ``LOG_EVERY_S``."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import resource

from broker.http.limits import HttpLimits

log = logging.getLogger(__name__)

FILE_SHARE = 0.75             # connections take at most this share of the open files (the rest: NATS, logs, workers)
HEAD_LIMIT = 16 * 1024        # bytes of a request line + headers (h11's and Node.js's default); beyond: 431
HEADER_COUNT_LIMIT = 100      # headers of a request (Apache's LimitRequestFields): each costs a few Python objects
KEEP_ALIVE_S = 30.0           # an idle keep-alive connection is closed after this
BODY_TIMEOUT_S = 60.0         # and its body within this, once the headers are in
PRESSURE_SHARE = 0.5          # with this share of the connections open, a new one must speak at once
LINGER_S = 1.0                # after a refusal, what the client still sends is read and dropped for this long
LINGER_BYTES = 64 * 1024      # or this much, so that it reads the refusal rather than a reset
LOG_EVERY_S = 5.0             # one log line per reason at most this often, with the count since the last

# what each reason of a refusal or a cut means in the log (the reason is the metric's label)
REASONS = {
    "client_limit": "connections refused: their client address already had {client_limit}",
    "total_limit": "connections refused: the bridge process already had {limit}",
    "head_too_large": "requests answered 431: request line and headers over {head} bytes",
    "uri_too_long": "requests answered 414: a URL over {url} bytes",
    "too_many_headers": "requests answered 431: over {headers} headers",
    "invalid": "requests answered 400: not valid HTTP/1.1",
    "silent": "connections cut: nothing sent within {header_s:g} s ({silent_s:g} s with {pressure} connections open)",
    "slow_head": "connections cut: headers not in within {header_s:g} s",
    "slow_body": "connections cut: body not in within {body_s:g} s",
}

_UNCOUNTED = 1 << 62   # a head's room while no head is being read (a body, a running request)


def _response(status: int, phrase: str, text: str, extra: bytes = b"") -> bytes:
    """A whole response that closes its connection (a refusal: nothing else is ever sent after it)."""
    body = text.encode()
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n").encode() + extra + b"\r\n" + body


class Edge:
    """One bridge process's connection slots (``limits``, and the open-file limit), and the count
    and log of what they refused or cut."""

    def __init__(self, limits: HttpLimits = HttpLimits(), refused=None) -> None:
        self.limits = limits
        files = _raise_file_limit(2 * limits.connections)
        self.limit = max(1, min(limits.connections, int(files * FILE_SHARE)))
        if self.limit < limits.connections:
            log.warning("HTTP edge: %d connections at most (%d open files allowed; %d wanted)",
                        self.limit, files, limits.connections)
        self.client_limit = min(limits.client_connections, self.limit)
        self.pressure_at = int(self.limit * PRESSURE_SHARE)
        self.total = 0
        self.clients: dict[str, int] = {}
        self._refused = refused            # a prometheus Counter labelled by reason, or None
        self._children: dict[str, object] = {}
        self._pending: dict[str, tuple[int, float]] = {}   # reason -> (count not logged yet, time of the first)
        self._quiet_until: dict[str, float] = {}
        self.busy = {"client_limit": _response(503, "Service Unavailable", "too many connections from your address",
                                                b"retry-after: 1\r\n"),
                      "total_limit": _response(503, "Service Unavailable", "too many connections", b"retry-after: 1\r\n")}

    def take(self, client: str) -> str | None:
        """A slot for a new connection of ``client``, or the reason there is none."""
        held = self.clients.get(client, 0)
        if held >= self.client_limit:
            return "client_limit"
        if self.total >= self.limit:
            return "total_limit"
        self.clients[client] = held + 1
        self.total += 1
        return None

    def release(self, client: str) -> None:
        held = self.clients[client] - 1
        if held:
            self.clients[client] = held
        else:
            del self.clients[client]
        self.total -= 1

    def note(self, reason: str, client: str | None) -> None:
        """One refusal or cut: counted, and logged unless this reason was logged within LOG_EVERY_S."""
        if self._refused is not None:
            child = self._children.get(reason)
            if child is None:
                child = self._children[reason] = self._refused.labels(reason=reason)
            child.inc()
        now = asyncio.get_running_loop().time()
        count, first = self._pending.get(reason, (0, now))
        count += 1
        if now < self._quiet_until.get(reason, 0.0):
            self._pending[reason] = (count, first)
            return
        self._pending.pop(reason, None)
        self._quiet_until[reason] = now + LOG_EVERY_S
        log.warning("HTTP edge: %s (%d in %.0f s, the last from %s; p2pfaas_http_refused_total{reason=\"%s\"})",
                    self._describe(reason), count, now - first, client, reason)

    def _describe(self, reason: str) -> str:
        return REASONS[reason].format(client_limit=self.client_limit, limit=self.limit, head=HEAD_LIMIT,
                                      url=HEAD_LIMIT // 2, headers=HEADER_COUNT_LIMIT, header_s=self.limits.header_timeout_s,
                                      silent_s=self.limits.silent_timeout_s, pressure=self.pressure_at, body_s=BODY_TIMEOUT_S)


def _raise_file_limit(wanted: int) -> int:
    """The soft limit of open files, raised towards ``wanted`` (each connection is one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    return wanted if soft == resource.RLIM_INFINITY else soft


class _TooManyHeaders(Exception):
    """Raised in the parser's header callback: the parser stops there."""


def _guarded_protocol():
    """uvicorn's httptools protocol with the edge and deadlines for a request's head and body."""
    if importlib.util.find_spec("httptools") is None:
        return "h11"
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    on_header = HttpToolsProtocol.on_header   # called once per header: no super() lookup

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        edge: Edge                       # set on the subclass made per server (serve_in_loop)
        _deadline: asyncio.TimerHandle | None = None
        _client: str | None = None       # the address whose slot this connection holds
        _head_room = 0                   # bytes the head being read may still take; < 0: refused, dropping

        # -- the connection ------------------------------------------------------------------
        def __init__(self, *args, **kwargs) -> None:
            self._uvicorn_args = args, kwargs   # uvicorn's set-up (a parser, loggers) waits for a slot

        def connection_made(self, transport) -> None:  # type: ignore[override]
            edge = self.edge
            peer = transport.get_extra_info("peername")
            client = peer[0] if isinstance(peer, tuple) else ""   # a unix socket: one client
            refusal = edge.take(client)
            if refusal is not None:     # never uvicorn's: a write and a close
                transport.write(edge.busy[refusal])
                transport.close()
                edge.note(refusal, client)
                return
            self._client = client
            self._head_room = HEAD_LIMIT
            args, kwargs = self._uvicorn_args
            super().__init__(*args, **kwargs)
            super().connection_made(transport)
            if edge.total > edge.pressure_at:
                self._arm(edge.limits.silent_timeout_s, "silent")
            else:
                self._arm(edge.limits.header_timeout_s, "silent")

        def connection_lost(self, exc) -> None:
            client, self._client = self._client, None
            if client is None:   # refused when it came: nothing was set up
                return
            self._disarm()
            self.edge.release(client)
            super().connection_lost(exc)

        def handle_websocket_upgrade(self) -> None:
            self._disarm()
            self._head_room = -1                 # nothing more for this parser
            super().handle_websocket_upgrade()
            ws = self.transport.get_protocol()   # its connection_lost gives the slot back
            if ws is not self and hasattr(ws, "edge_client"):
                ws.edge_client, self._client = self._client, None

        # -- deadlines -------------------------------------------------------------------------
        def _arm(self, seconds: float, reason: str | None) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._too_slow, reason)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self, reason: str | None) -> None:
            self._deadline = None
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()
                if reason is not None:
                    self.edge.note(reason, self._client)

        # -- reading: the head's bytes counted before the parser sees them ---------------------
        def data_received(self, data: bytes) -> None:
            room = self._head_room - len(data)
            if room < 0:
                return self._beyond_room(data)
            self._head_room = room
            self._feed(data)

        def _beyond_room(self, data) -> None:
            room = self._head_room
            if room < 0:   # refused: dropped, until the client has read the refusal or LINGER_BYTES came
                self._head_room = room - len(data)
                if self._head_room < -LINGER_BYTES:
                    self.transport.close()
                return
            # the head may end within the room, a body or the next request following it: the room first
            view = memoryview(data)
            self._head_room = 0
            self._feed(view[:room])
            if self._head_room < 0 or self.transport.is_closing():
                return
            if self._head_room == 0:   # still in the head, and no room left
                url = getattr(self, "url", b"")
                if 2 * len(url) > HEAD_LIMIT:
                    self._refuse(414, "URI Too Long", f"request URL over {HEAD_LIMIT // 2} bytes", "uri_too_long")
                else:
                    self._refuse(431, "Request Header Fields Too Large",
                                 f"request line and headers over {HEAD_LIMIT} bytes", "head_too_large")
                return
            self.data_received(view[room:])

        def _feed(self, data) -> None:
            """uvicorn's data_received, with its refusals made (counted, logged sparingly) by the edge."""
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, _TooManyHeaders):
                    self._refuse(431, "Request Header Fields Too Large",
                                 f"over {HEADER_COUNT_LIMIT} request headers", "too_many_headers")
                else:
                    self._refuse(400, "Bad Request", "Invalid HTTP request received.", "invalid")

        def _refuse(self, status: int, phrase: str, text: str, reason: str) -> None:
            """Answer ``status`` and close (a pipelined response being written is cut instead)."""
            self._head_room = -1
            self.edge.note(reason, self._client)
            transport = self.transport
            if transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()
                transport.close()
                return
            transport.write(_response(status, phrase, text))
            if transport.can_write_eof():
                transport.write_eof()
                self._arm(LINGER_S, None)
            else:
                self._disarm()
                transport.close()

        # -- the parser's callbacks --------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(self.edge.limits.header_timeout_s, "slow_head")

        def on_header(self, name: bytes, value: bytes) -> None:
            if len(self.headers) >= HEADER_COUNT_LIMIT:
                raise _TooManyHeaders
            on_header(self, name, value)

        def on_headers_complete(self) -> None:
            self._head_room = _UNCOUNTED
            super().on_headers_complete()
            self._arm(BODY_TIMEOUT_S, "slow_body")
            if self.cycle is not None and not isinstance(self.cycle.transport, _OneWrite):
                self.cycle.transport = _OneWrite(self.transport, self.loop)

        def on_message_complete(self) -> None:
            self._disarm()   # the app runs as long as it needs; keep-alive has its own timeout
            self._head_room = HEAD_LIMIT   # the rest of this read (a pipelined request) goes uncounted
            super().on_message_complete()

    return GuardedHttpToolsProtocol


def edge_websocket(edge: Edge):
    """uvicorn's WebSocket protocol, giving back the slot of the connection that upgraded to it."""
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol
    if AutoWebSocketsProtocol is None:
        return "none"

    class EdgeWebSocket(AutoWebSocketsProtocol):   # type: ignore[misc, valid-type]
        edge_client: str | None = None

        def connection_lost(self, exc) -> None:
            client, self.edge_client = self.edge_client, None
            if client is not None:
                edge.release(client)
            super().connection_lost(exc)

    return EdgeWebSocket


class _OneWrite:
    """A response's transport writing its head with the body that follows in one system call (uvicorn's two
    wake the client twice): the first write waits for the next or the end of this turn of the loop."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport, loop) -> None:
        self._transport, self._loop, self._held = transport, loop, None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self._flush)
            return
        self._held = None
        if not self._transport.is_closing():
            self._transport.write(held + data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_now(self, data: bytes) -> None:
        """A whole response: what is held goes first, then ``data``, without waiting for the turn's end."""
        self._flush()
        self._transport.write(data)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


HTTP_IMPLEMENTATION = _guarded_protocol()

try:   # the cycle of uvicorn's httptools protocol, whose ASGI ``send`` write_whole stands in for
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE as _STATUS_LINE
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as _Cycle
except ImportError:   # no httptools: h11's cycle, and every response through ASGI
    _Cycle, _STATUS_LINE = None, {}
_WHOLE_STATE = ("response_started", "response_complete", "disconnected", "keep_alive", "flow", "transport",
                "default_headers", "message_event", "on_response", "access_log", "waiting_for_100_continue")
if _Cycle is not None and not all(name in _Cycle.__init__.__code__.co_names for name in _WHOLE_STATE):
    _Cycle = None   # a uvicorn whose cycle keeps its state otherwise: ASGI's send, always


def write_whole(send, status: int, head: bytes, body: bytes) -> bool:
    """Write a whole response in one call, instead of ASGI's two ``send`` events: ``head`` is its header
    lines (each ending CRLF, checked by the caller), without content-length. False when ``send`` is not
    an idle uvicorn httptools cycle (another server, a test's transport, a paused write, an access log):
    the caller sends through ASGI then. What uvicorn's ``send`` would do, done once, for the hot path."""
    cycle = getattr(send, "__self__", None)
    if _Cycle is None or type(cycle) is not _Cycle or cycle.response_started or cycle.access_log \
            or cycle.flow.write_paused or status not in _STATUS_LINE:
        return False
    cycle.response_started, cycle.waiting_for_100_continue = True, False
    if cycle.disconnected:
        return True
    transport = cycle.transport
    if not transport.is_closing():
        defaults = b"".join(b"%s: %s\r\n" % pair for pair in cycle.default_headers)   # date, server
        response = b"%s%s%scontent-length: %d\r\n%s\r\n%s" % (
            _STATUS_LINE[status], defaults, head, len(body), b"" if cycle.keep_alive else b"connection: close\r\n", body)
        if isinstance(transport, _OneWrite):
            transport.write_now(response)
        else:
            transport.write(response)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        transport.close()
    cycle.on_response()
    return True
