"""Every p2pfaas error, in one tree::

    FaasError
    ├── InvalidToken          a subject/topic token outside [A-Za-z0-9_-]{1,64}
    ├── InvalidSubject        a subject/topic that is not one of ours
    ├── ContractError         a payload that does not match its message contract
    ├── BrokerUnavailable     nats-server / mosquitto cannot be reached or started
    ├── NodeUnavailable       no node answers a direct call (not running, gone mid-call)
    ├── PayloadTooLarge       a body over the configured limit
    ├── Unauthorized          a missing or wrong bearer token on a route that needs one
    ├── Forbidden             a request the configuration does not allow (e.g. a callback host)
    ├── NodeFileError         a file a node keeps (configuration.json, functions.json, ...) it cannot read

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


class Unauthorized(FaasError, PermissionError):
    http_status = 401


class Forbidden(FaasError, PermissionError):
    http_status = 403


class NotPermitted(FaasError, PermissionError):
    """The broker refused to let this identity publish there: a deployment's permissions do not
    cover what it was asked to do (a misconfiguration, or a caller reaching past its rights)."""
    http_status = 500


class DataDirInUse(FaasError, RuntimeError):
    """A ``p2pfaas up`` (or a node) holds this data directory's lock: a second one would end its
    processes and rewrite its configuration under it."""
    http_status = 409

    def __init__(self, data_dir: object, holder: str, owner: str = "`p2pfaas up`", flag: str = "--data-dir") -> None:
        super().__init__(f"{data_dir} is in use by another {owner} (pid {holder}); "
                         f"stop it first, or give this one another {flag}")
        self.holder = holder


class NodeFileError(FaasError, ValueError):
    """A file the node keeps under ``<data-dir>/nodes/<node>/`` is unreadable or not valid: the node
    refuses to start rather than run without what it holds and overwrite it with its next save."""
    http_status = 500
