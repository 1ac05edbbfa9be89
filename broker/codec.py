"""The one codec: message contracts <-> bytes on the wire (orjson)."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from broker.errors import ContractError

M = TypeVar("M", bound=BaseModel)


def encode(message: BaseModel) -> bytes:
    return orjson.dumps(message.model_dump(mode="json"))


def decode(contract: type[M], data: bytes) -> M:
    """Parse ``data`` as ``contract``; ContractError with a readable reason otherwise."""
    try:
        return contract.model_validate(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        raise ContractError(f"{contract.__name__}: not valid JSON ({exc})") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
        )
        raise ContractError(f"{contract.__name__}: {problems}") from None
