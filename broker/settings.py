"""What every process's broker connection reads from its environment: one object, ``P2PFAAS_`` prefix.

Read when a connection or a stream is made, not cached: a launcher sets these for its children,
and tests set them per test. A node's own settings are ``nodes.settings.NodeSettings``."""

from __future__ import annotations

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="P2PFAAS_", env_ignore_empty=True, extra="ignore")

    tls_ca: str | None = None        # the CA file of a deployment's own TLS (up --tls)
    inbox_prefix: str | None = None  # a device's: the hub sends it only its own replies (broker/edge.py)
    stream_replicas: int = Field(default=1, ge=1, le=5)   # JetStream's limit; 3 in compose.yaml's cluster


def broker_settings() -> BrokerSettings:
    """This process's, now; a bad value is a ValueError naming its variable."""
    try:
        return BrokerSettings()
    except ValidationError as exc:   # it names the field, not the variable
        fields = ", ".join(f"P2PFAAS_{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"broker settings: {fields}") from None
