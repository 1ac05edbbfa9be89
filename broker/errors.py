"""Every p2pfaas error, in one tree::

    FaasError
    ├── InvalidToken          a subject/topic token outside [A-Za-z0-9_-]{1,64}
    ├── InvalidSubject        a subject/topic that is not one of ours
    ├── ContractError         a payload that does not match its message contract
    ├── BrokerUnavailable     nats-server / mosquitto cannot be reached or started
    ├── NodeUnavailable       no node answers a direct call (not running, gone mid-call)
    └── PayloadTooLarge       a body over the configured limit

Each error carries the HTTP status the bridges answer with.
"""

from __future__ import annotations


class FaasError(Exception):
    http_status = 500


class InvalidToken(FaasError, ValueError):
    http_status = 400


class InvalidSubject(FaasError, ValueError):
    http_status = 400


class ContractError(FaasError, ValueError):
    http_status = 400


class BrokerUnavailable(FaasError, RuntimeError):
    http_status = 503


class NodeUnavailable(FaasError, RuntimeError):
    http_status = 503


class PayloadTooLarge(FaasError, ValueError):
    http_status = 413
