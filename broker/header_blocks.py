"""NATS header blocks as they travel, written and read as nats-py would for the same bytes
(tests/broker/test_connection.py), without its per-character checks of every name."""

from __future__ import annotations

from typing import Iterator, Mapping

from nats import errors as nats_errors
from nats.aio.client import _CRLF_, _HEADER_KEY_RE, _HEADER_VALUE_NEWLINES, NATS_HDR_LINE, Client

_WS = " \t\n\r\x0b\x0c"          # what bytes.strip() strips
_START = bytes(NATS_HDR_LINE) + _CRLF_
_STATUS_LEN = 3                   # nats-server's inline status: NATS/1.0 503
_NAMES: dict[str, str] = {}       # header name -> its validated "Name: " (names repeat on every call)
_NAMES_MAX = 1024


def encode_headers(headers: dict) -> bytes:
    """nats-py's header block for ``headers``, each name's check and encoding done once."""
    return _START + header_text(headers).encode() + _CRLF_


def header_block(lines: bytes) -> bytes:
    """The header block of ``NatsClient.send`` around ``lines`` (:func:`header_text`, encoded)."""
    return _START + lines + _CRLF_


def header_text(headers: dict) -> str:
    """``Name: value`` CRLF for each header, as nats-py writes them: a block rendered ahead."""
    parts = []
    for name, value in headers.items():
        prefix = _NAMES.get(name)
        if prefix is None:
            key = name.strip()
            if not key:
                continue
            if not _HEADER_KEY_RE.fullmatch(key):
                raise nats_errors.BadHeaderError(key)
            prefix = key + ": "
            if len(_NAMES) < _NAMES_MAX:
                _NAMES[name] = prefix
        parts += (prefix, value.strip().translate(_HEADER_VALUE_NEWLINES), "\r\n")
    return "".join(parts)


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's ``_parse_header_lines``, decoding an all-ASCII block once (others go to nats-py's)."""
    if not raw.isascii():
        return Client._parse_header_lines(raw)
    out: dict[str, str] = {}
    for line in raw.decode("ascii").split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            key = name.strip(_WS)
            if key and key.split() != [key]:   # whitespace inside a name: not a header
                continue
            out[key] = value.strip(_WS)
    return out


def parse_header_block(block: bytes) -> dict[str, str] | None:
    """nats-py's ``_process_headers`` of a header block, without a coroutine (read loop)."""
    if not block:
        return None
    hdr: dict[str, str] | None = None
    raw = block[len(NATS_HDR_LINE):]
    if raw[:1] == b" ":   # NATS/1.0 503\r\n\r\n, NATS/1.0 100 Idle Heartbeat\r\n...
        line = block[len(NATS_HDR_LINE) + 1:]
        status = line[:_STATUS_LEN].strip().decode()
        desc = line[_STATUS_LEN + 1:len(line) - 2 * len(_CRLF_)]
        hdr = {"Status": status} if status.isdigit() else {}
        raw = raw[raw.find(_CRLF_) + len(_CRLF_):]
        if desc:
            i = desc.find(_CRLF_)
            if i > 0:
                hdr["Description"] = desc[:i].decode()
                hdr.update(parse_header_lines(desc[i + len(_CRLF_):]))
            else:
                hdr["Description"] = desc.decode()
    if not len(raw) > len(_CRLF_):
        return hdr
    parsed = parse_header_lines(block[len(NATS_HDR_LINE) + len(_CRLF_):])
    if hdr:
        hdr.update(parsed)
    else:
        hdr = parsed
    return hdr or None


class HeaderBlock(Mapping[str, str]):
    """A message's headers read only when asked: one by ``get``, else all, once."""

    __slots__ = ("_block", "_parsed")

    def __init__(self, block: bytes) -> None:
        self._block = block
        self._parsed: dict[str, str] | None = None

    @property
    def block(self) -> bytes:
        return self._block

    def parsed(self) -> dict[str, str]:
        """Every header, as a dict (the block is read once; ``dict(self)`` costs a call per name)."""
        if self._parsed is None:
            self._parsed = parse_header_block(self._block) or {}
        return self._parsed

    def get(self, name: str, default: str | None = None) -> str | None:   # type: ignore[override]
        """``Mapping.get``, from the bytes when the name occurs once in an all-ASCII block, else parsed."""
        if self._parsed is None:
            block, key = self._block, name.encode()
            at = block.find(b"\r\n" + key + b":")
            # (a block with an inline status is nats-py's to read: its second line is a description)
            if at >= 0 and block[len(NATS_HDR_LINE):len(NATS_HDR_LINE) + 1] != b" " and block.count(key) == 1 \
                    and block.isascii():
                start = at + len(key) + 3
                end = block.find(b"\r\n", start)
                if end >= 0:
                    return block[start:end].decode().strip(_WS)
        return self.parsed().get(name, default)

    def __getitem__(self, name: str) -> str:
        return self.parsed()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.parsed())

    def __len__(self) -> int:
        return len(self.parsed())

    def __bool__(self) -> bool:   # a block is only made for a message that has one (no parse to say so)
        return bool(self._block)

    def __repr__(self) -> str:
        return repr(self.parsed())
