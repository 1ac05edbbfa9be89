"""The one codec: message contracts <-> bytes on the wire (orjson), and the frame that carries
a contract together with raw bytes (a worker call and its payload) without base64."""

from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from broker.errors import ContractError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
ENTRY_ROOM = 1024   # bytes a batch's JSON may take per entry, beside its payload (split_by_size)
_LENGTH = 4  # bytes of the frame's header: the length of the contract's JSON, big-endian


def encode(message: BaseModel) -> bytes:
    return orjson.dumps(message.model_dump(mode="json"))


def decode(contract: type[M], data: bytes) -> M:
    """Parse ``data`` as ``contract``; ContractError with a readable reason otherwise."""
    try:
        return contract.model_validate_json(data)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0]["type"] == "json_invalid":
            raise ContractError(f"{contract.__name__}: not valid JSON ({errors[0]['msg']})") from None
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
        )
        raise ContractError(f"{contract.__name__}: {problems}") from None


def decode_update(current: M, data: bytes) -> M:
    """``current`` with the keys of the JSON object ``data`` replaced (P2PFaaS merges configurations)."""
    try:
        sent = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ContractError(f"{type(current).__name__}: not valid JSON ({exc})") from None
    if not isinstance(sent, dict):
        raise ContractError(f"{type(current).__name__}: must be a JSON object")
    return decode(type(current), orjson.dumps({**current.model_dump(mode="json"), **sent}))


def frame(message: BaseModel | dict, payload: bytes) -> bytes:
    """``message`` (a contract, or its JSON as a dict) and raw ``payload`` in one body."""
    meta = orjson.dumps(message) if isinstance(message, dict) else encode(message)
    return len(meta).to_bytes(_LENGTH, "big") + meta + payload


def unframe(contract: type[M], data: bytes) -> tuple[M, bytes]:
    """The contract and the payload of a :func:`frame`; ContractError when it is not one."""
    size = int.from_bytes(data[:_LENGTH], "big")
    if len(data) < _LENGTH or len(data) < _LENGTH + size:
        raise ContractError(f"{contract.__name__}: truncated frame ({len(data)} bytes)")
    return decode(contract, data[_LENGTH:_LENGTH + size]), data[_LENGTH + size:]


def split_by_size(items: Sequence[T], sizes: Sequence[int], limit: int) -> Iterator[list[T]]:
    """``items`` in order, in runs whose ``sizes`` (+ ENTRY_ROOM each) fit ``limit``."""
    run: list[T] = []
    used = 0
    for item, size in zip(items, sizes):
        if run and used + size + ENTRY_ROOM > limit:
            yield run
            run, used = [], 0
        run.append(item)
        used += size + ENTRY_ROOM
    if run:
        yield run
