"""What one HTTP bridge process allows its clients, and how long it waits for them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HttpLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    connections: int = Field(default=4096, ge=1)          # per bridge process, all clients together; beyond: 503
    client_connections: int = Field(default=256, ge=1)    # of one client address: it cannot take the others' slots
    header_timeout_s: float = Field(default=10.0, gt=0)   # a request's headers must arrive within this (slowloris)
    silent_timeout_s: float = Field(default=2.0, gt=0)    # under pressure, a new connection's first byte within this
    callback_look_s: float = Field(default=60.0, gt=0)    # an async call's stored answer is looked up this often
    callback_post_s: float = Field(default=10.0, gt=0)    # a callback POST, its response included, ends within this
