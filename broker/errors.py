"""Every p2pfaas error: a FaasError carrying the HTTP status the bridges answer with."""

from __future__ import annotations


class FaasError(Exception):
    http_status = 500


class InvalidToken(FaasError, ValueError):   # a subject/topic token outside [A-Za-z0-9_-]{1,64}
    http_status = 400


class InvalidSubject(FaasError, ValueError):   # a subject/topic that is not one of ours
    http_status = 400


class ContractError(FaasError, ValueError):
    http_status = 400


class BrokerUnavailable(FaasError, RuntimeError):   # nats-server / mosquitto cannot be reached or started
    http_status = 503


class NodeUnavailable(FaasError, RuntimeError):   # no node answers a direct call (none, or gone mid-call)
    http_status = 503


class PayloadTooLarge(FaasError, ValueError):
    http_status = 413


class Unauthorized(FaasError, PermissionError):
    http_status = 401


class Forbidden(FaasError, PermissionError):   # a request the configuration does not allow (a callback host)
    http_status = 403


class NotPermitted(FaasError, PermissionError):
    """The broker refused to let this identity publish there (its permissions do not cover it)."""
    http_status = 500


class DataDirInUse(FaasError, RuntimeError):
    """A ``p2pfaas up`` (or a node) holds this data directory's lock."""
    http_status = 409

    def __init__(self, data_dir: object, holder: str, owner: str = "`p2pfaas up`", flag: str = "--data-dir") -> None:
        super().__init__(f"{data_dir} is in use by another {owner} (pid {holder}); "
                         f"stop it first, or give this one another {flag}")
        self.holder = holder


class NodeFileError(FaasError, ValueError):
    """A file under ``<data-dir>/nodes/<node>/`` is unreadable: the node refuses to overwrite it."""
    http_status = 500
