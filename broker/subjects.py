"""Subjects and topics: built and parsed here and nowhere else. NATS uses ``.`` between tokens, MQTT
``/``; :func:`to_mqtt` and :func:`from_mqtt` apply the mapping nats-server's MQTT listener does."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from broker.errors import InvalidSubject, InvalidToken

TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")   # \Z: "$" would also match before a final newline
# second-level tokens of shared subjects: a node so named would collide with them (and with their streams)
RESERVED_NODE_IDS = frozenset({"result", "reject", "membership", "deadletter", "async", "storecheck"})
DEFAULT_PREFIX = "faas"
DEFAULT_GROUP = "default"


def group_token(group: str) -> str:
    """The subject token of a P2PFaaS group name: itself if a valid token, else a digest."""
    if not group:
        return DEFAULT_GROUP
    if TOKEN_RE.match(group):
        return group
    return "g" + hashlib.sha256(group.encode()).hexdigest()[:24]


_KNOWN_GOOD: set[str] = set()   # names seen valid (functions, clients, nodes repeat on every call)
_KNOWN_GOOD_MAX = 4096


def check_token(value: str, what: str = "token") -> str:
    if type(value) is str and value in _KNOWN_GOOD:
        return value
    if not isinstance(value, str) or not TOKEN_RE.match(value):
        raise InvalidToken(f"invalid {what} {value!r}: must match [A-Za-z0-9_-]{{1,64}}")
    if what != "request id" and len(_KNOWN_GOOD) < _KNOWN_GOOD_MAX:   # ids never come twice
        _KNOWN_GOOD.add(value)
    return value


def check_node(value: str) -> str:
    check_token(value, "node")
    if value in RESERVED_NODE_IDS:
        raise InvalidToken(f"node id {value!r} is reserved ({', '.join(sorted(RESERVED_NODE_IDS))})")
    return value


def machine_token(ip: str) -> str:
    """The token naming a P2PFaaS machine known by its IP address (``http-10-0-0-5``): an IP is no token."""
    return "http-" + re.sub(r"[^A-Za-z0-9_-]", "-", ip)[:59]


def to_mqtt(subject: str) -> str:
    return subject.replace(".", "/")


def from_mqtt(topic: str) -> str:
    """MQTT topic -> NATS subject; refuses what cannot map one to one."""
    if not topic or "." in topic or " " in topic or "//" in topic or topic.startswith("/") or topic.endswith("/"):
        raise InvalidSubject(f"topic {topic!r} cannot be mapped to a subject")
    return topic.replace("/", ".")


# Learner models (docs/learner.md): the node's scheduling model and one per scaled pool.
SCHEDULING_MODEL = "scheduling"
SCALING_MODEL_PREFIX = "scaling-"
LearnerVerb = Literal["act", "weights", "weights.get", "weights.set", "parameters.get", "parameters.set", "stats",
                      "reset"]
LEARNER_VERBS: frozenset[str] = frozenset(LearnerVerb.__args__)  # type: ignore[attr-defined]


def scaling_model(pool: str) -> str:
    """Model token of a pool's scaling model (pool names up to 56 characters)."""
    return check_token(SCALING_MODEL_PREFIX + check_token(pool, "pool"), "model")


def pool_of_model(model: str) -> str | None:
    """The pool of a scaling model token, None for any other model."""
    if model.startswith(SCALING_MODEL_PREFIX) and TOKEN_RE.match(model[len(SCALING_MODEL_PREFIX):]):
        return model[len(SCALING_MODEL_PREFIX):]
    return None


# P2PFaaS's discovery API (docs/compat.md): machines announced over HTTP, reset, configuration
DiscoveryVerb = Literal["register", "reset", "config.get", "config.set"]
# OpenFaaS's management API (docs/compat.md): the node's functions and pools, the deployment's secrets
FunctionsVerb = Literal["list", "deploy", "delete", "scale", "scale_delay", "secrets_list", "secrets_set",
                        "secrets_delete"]

Kind = Literal["request", "forward", "async"]


@dataclass(frozen=True, slots=True)
class Invocation:
    """A parsed ``<prefix>.<node>.(request|forward).<fn>.<client>.<req>`` or ``.async.`` subject."""

    node: str
    kind: Kind
    fn: str
    client: str
    request_id: str

    @property
    def call_key(self) -> str:
        """Unique id of the call across the system (used for dedup)."""
        return f"{self.client}.{self.request_id}"


@dataclass(frozen=True, slots=True)
class Subjects:
    """All subjects of one deployment (one prefix)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_token(self.prefix, "prefix")

    # -- invocation -------------------------------------------------------
    def request(self, node: str, fn: str, client: str, req: str) -> str:
        """Direct call (request/reply); published without a reply subject it becomes an async call."""
        return self._join(node, "request", check_token(fn, "function"), check_token(client, "client"), check_token(req, "request id"))

    def forward(self, node: str, fn: str, client: str, req: str) -> str:
        """Node to node (request/reply): the peer runs it and answers the forwarding node."""
        return self._join(node, "forward", check_token(fn, "function"), check_token(client, "client"), check_token(req, "request id"))

    def async_request(self, node: str, fn: str, client: str, req: str) -> str:
        """Durable call: stored once in the async stream, answered on the result/reject subjects."""
        return ".".join((self.prefix, "async", check_node(node), check_token(fn, "function"),
                         check_token(client, "client"), check_token(req, "request id")))

    def requests_of(self, node: str) -> str:
        return self._join(node, "request", ">")

    def forwards_of(self, node: str) -> str:
        return self._join(node, "forward", ">")

    def async_of(self, node: str) -> str:
        return f"{self.prefix}.async.{check_node(node)}.>"

    def all_async(self) -> str:
        return f"{self.prefix}.async.>"

    def async_call(self, client: str, req: str) -> str:
        """The async call ``req`` of ``client`` as stored in the intake, whatever its node and function."""
        return f"{self.prefix}.async.*.*.{check_token(client, 'client')}.{check_token(req, 'request id')}"

    def stored_async_of(self, token: str) -> str:
        """The async calls stored for a node token read off a subject (maybe no valid node)."""
        if not token or any(c in token for c in ".*> \t\r\n"):
            raise InvalidToken(f"not a subject token: {token!r}")
        return f"{self.prefix}.async.{token}.>"

    def parse_invocation(self, subject: str) -> Invocation:
        """Parse a request/forward/async subject; InvalidSubject/InvalidToken says what is wrong."""
        parts = subject.split(".")
        if len(parts) == 6 and parts[0] == self.prefix and parts[1] == "async":
            _, kind, node, fn, client, req = parts
        elif len(parts) == 6 and parts[0] == self.prefix and parts[2] in ("request", "forward"):
            _, node, kind, fn, client, req = parts
        else:
            raise InvalidSubject(
                f"{subject!r} is not {self.prefix}.<node>.request.<fn>.<client>.<req>"
            )
        check_node(node)
        check_token(fn, "function")
        check_token(client, "client")
        check_token(req, "request id")
        return Invocation(node, kind, fn, client, req)  # type: ignore[arg-type]

    def salvage_reply_to(self, subject: str) -> tuple[str, str] | None:
        """(client, req) of a malformed invocation subject, if those two are valid."""
        parts = subject.split(".")
        if len(parts) == 6 and TOKEN_RE.match(parts[4]) and TOKEN_RE.match(parts[5]):
            return parts[4], parts[5]
        return None

    # -- answers ----------------------------------------------------------
    def result(self, client: str, req: str) -> str:
        return f"{self.prefix}.result.{check_token(client, 'client')}.{check_token(req, 'request id')}"

    def reject(self, client: str, req: str) -> str:
        return f"{self.prefix}.reject.{check_token(client, 'client')}.{check_token(req, 'request id')}"

    def results_of(self, client: str) -> str:
        return f"{self.prefix}.result.{check_token(client, 'client')}.>"

    def rejects_of(self, client: str) -> str:
        return f"{self.prefix}.reject.{check_token(client, 'client')}.>"

    def invalid(self) -> str:
        """Where errors go when the caller's own tokens are unusable."""
        return f"{self.prefix}.reject.invalid"

    def all_results(self) -> str:
        return f"{self.prefix}.result.>"

    def all_rejects(self) -> str:
        return f"{self.prefix}.reject.>"

    def answer_ids(self, subject: str) -> tuple[str, str, str]:
        """(kind, client, req) of a result/reject subject."""
        parts = subject.split(".")
        if len(parts) != 4 or parts[0] != self.prefix or parts[1] not in ("result", "reject"):
            raise InvalidSubject(f"{subject!r} is not a result/reject subject")
        return parts[1], parts[2], parts[3]

    # -- node internals ---------------------------------------------------
    def worker(self, node: str, worker: str) -> str:
        """A worker's own dispatch subject: the node sends it calls (request/reply)."""
        return self._join(node, "worker", check_token(worker, "worker"))

    def worker_status(self, node: str, worker: str) -> str:
        """Request/reply: which of the node's calls a worker still runs (after a broker outage)."""
        return self._join(node, "worker", check_token(worker, "worker"), "status")

    def gone(self, node: str) -> str:
        """Published when a node stops (or its workers saw it die): callers waiting on it fail at once."""
        return self._join(node, "gone")

    def all_gone(self) -> str:
        return f"{self.prefix}.*.gone"

    def deadletter(self, node: str, fn: str) -> str:
        return f"{self.prefix}.deadletter.{check_token(node, 'node')}.{check_token(fn, 'function')}"

    def all_deadletters(self) -> str:
        return f"{self.prefix}.deadletter.>"

    def load(self, node: str) -> str:
        return self._join(node, "load")

    def config(self, node: str, verb: Literal["get", "set"]) -> str:
        return self._join(node, "config", verb)

    def scheduler_config(self, node: str, verb: Literal["get", "set"]) -> str:
        return self._join(node, "config", "scheduler", verb)

    def metrics(self, node: str) -> str:
        return self._join(node, "metrics")

    def info(self, node: str) -> str:
        return self._join(node, "info")

    def peers(self, node: str) -> str:
        """Request/reply: the node's alive peers (P2PFaaS discovery ``GET /list``)."""
        return self._join(node, "peers")

    def discovery(self, node: str, verb: DiscoveryVerb) -> str:
        """Request/reply: P2PFaaS's discovery API of a node (machines that speak HTTP, its configuration)."""
        return self._join(node, "discovery", *verb.split("."))

    def functions(self, node: str, verb: FunctionsVerb) -> str:
        """Request/reply: the node's function registry and pools (OpenFaaS's ``/system/*`` routes)."""
        return self._join(node, "functions", verb)

    def membership(self, node: str, group: str = DEFAULT_GROUP) -> str:
        """A node's heartbeats, within its group (P2PFaaS's fog network: nodes see only their own)."""
        return f"{self.prefix}.membership.{group_token(group)}.{check_token(node, 'node')}"

    def all_membership(self, group: str | None = None) -> str:
        """Heartbeats of one group's nodes, or (None) of every group's (the dashboard, ``top``)."""
        return f"{self.prefix}.membership.{'*' if group is None else group_token(group)}.*"

    def membership_of(self, node: str) -> str:
        """A node's heartbeats in whatever group it is (its workers watch it)."""
        return f"{self.prefix}.membership.*.{check_token(node, 'node')}"

    def telemetry(self, node: str, pool: str) -> str:
        return self._join(node, "telemetry", check_token(pool, "pool"))

    def all_telemetry(self) -> str:
        return f"{self.prefix}.*.telemetry.*"

    def pulse(self, node: str, pool: str) -> str:
        """A pool's ``PoolPulse`` between its control periods (the controller's panic rule)."""
        return self._join(node, "pulse", check_token(pool, "pool"))

    def all_pulses(self) -> str:
        return f"{self.prefix}.*.pulse.*"

    def scale(self, node: str, pool: str) -> str:
        return self._join(node, "scale", check_token(pool, "pool"))

    def all_scale(self) -> str:
        return f"{self.prefix}.*.scale.*"

    def pool_policy(self, node: str, pool: str) -> str:
        """Request/reply: switch the scaling policy of a pool's controller (PolicySwitch -> PolicySwitched)."""
        return self._join(node, "policy", check_token(pool, "pool"))

    def reward(self, node: str) -> str:
        return self._join(node, "reward")

    def store_check(self, node: str) -> str:
        """A node's tiny periodic write: JetStream can still store (nodes/store_check.py)."""
        return f"{self.prefix}.storecheck.{check_node(node)}"

    def all_store_checks(self) -> str:
        return f"{self.prefix}.storecheck.*"

    def experience(self, node: str, pool: str) -> str:
        return self._join(node, "experience", check_token(pool, "pool"))

    def all_rewards(self) -> str:
        return f"{self.prefix}.*.reward"

    def all_scaling_experiences(self) -> str:
        return f"{self.prefix}.*.experience.*"

    # -- learner (docs/learner.md) ---------------------------------------------
    def experiences_of(self, node: str) -> str:
        return self._join(node, "experience", ">")

    def parse_experience(self, subject: str) -> tuple[str, str | None]:
        """(node, pool) of ``<prefix>.<node>.reward`` (pool None) or ``...experience.<pool>``."""
        parts = subject.split(".")
        if len(parts) == 3 and parts[0] == self.prefix and parts[2] == "reward":
            return check_node(parts[1]), None
        if len(parts) == 4 and parts[0] == self.prefix and parts[2] == "experience":
            return check_node(parts[1]), check_token(parts[3], "pool")
        raise InvalidSubject(f"{subject!r} is not {self.prefix}.<node>.reward or .experience.<pool>")

    def learner(self, node: str, model: str, verb: LearnerVerb) -> str:
        """``<prefix>.<node>.learner.<model>.<verb>``; ``weights`` is published, the rest are request/reply."""
        if verb not in LEARNER_VERBS:
            raise InvalidSubject(f"unknown learner verb {verb!r}")
        return self._join(node, "learner", check_token(model, "model"), verb)

    def learner_all_models(self, node: str, verb: LearnerVerb) -> str:
        """Subscription to ``verb`` of every model of ``node``."""
        if verb not in LEARNER_VERBS:
            raise InvalidSubject(f"unknown learner verb {verb!r}")
        return self._join(node, "learner", "*", verb)

    def all_learner_weights(self) -> str:
        """Weights every learner of the deployment publishes (``<prefix>.<node>.learner.<model>.weights``)."""
        return f"{self.prefix}.*.learner.*.weights"

    def parse_learner(self, subject: str) -> tuple[str, str, str]:
        """(node, model, verb) of a learner subject."""
        parts = subject.split(".")
        verb = ".".join(parts[4:])
        if len(parts) < 5 or parts[0] != self.prefix or parts[2] != "learner" or verb not in LEARNER_VERBS:
            raise InvalidSubject(f"{subject!r} is not {self.prefix}.<node>.learner.<model>.<verb>")
        return check_node(parts[1]), check_token(parts[3], "model"), verb

    def _join(self, node: str, *rest: str) -> str:
        return ".".join((self.prefix, check_node(node), *rest))
