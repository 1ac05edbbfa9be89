"""The wire protocol in one table: every subject, its pattern, who sends and receives, and the contracts
of what it carries and what answers it (broker/protocol_docs.py writes the docs from it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal

from pydantic import BaseModel

from broker import headers as H
from broker.messages import (
    DiscoveryConfiguration, FunctionDeployment, FunctionInfo, FunctionList, FunctionScale, Heartbeat, LearnerActRequest,
    LearnerAction, LearnerStats, LearnerWeights, MachineAnnouncement, NodeConfiguration, NodeGone, NodeLoad, PeerList,
    PolicySwitch, PolicySwitched, PoolPulse, PoolTelemetry, Rejection, Result, ScaleCommand, SchedulerChange,
    SchedulerConfiguration, SchedulingExperience, ScalingExperience, SecretChange, WorkerCalls, WorkerOutcomes,
    WorkerStatus, WorkerStatusRequest,
)
from broker.subjects import DEFAULT_PREFIX, Subjects


@dataclass(frozen=True)
class Raw:
    """A payload that is no JSON contract (a function's bytes, Prometheus text, nothing)."""

    name: str
    summary: str
    content_type: str = "application/octet-stream"


Payload = type[BaseModel] | Raw
Pattern = Literal["request/reply", "publish", "stored"]

# the tokens the channels are built with, and the placeholders the documents show for them
PLACEHOLDERS = {"NODE": "node", "FN": "fn", "CLIENT": "client", "REQ": "req", "POOL": "pool",
                "WORKER": "worker", "GROUP": "group", "MODEL": "model"}
PARAMETERS = {
    "node": "a node's id", "fn": "a function's name", "client": "the caller's client id",
    "req": "the call's id, unique for its client", "pool": "a worker pool of the node",
    "worker": "a worker process of the node", "group": "the node's P2PFaaS group (its token)",
    "model": "a learner model: `scheduling` or `scaling-<pool>`",
}
BUCKETS = [("FAAS_FUNCTIONS", "one key per deployed function (nodes/catalogue.py); last value"),
           ("FAAS_SECRETS", "one key per secret, sealed with AES-256-GCM (broker/secrets.py); last value")]


@dataclass(frozen=True)
class Channel:
    id: str
    build: Callable[[Subjects], str]   # the subject, from Subjects with the PLACEHOLDERS tokens
    pattern: Pattern
    sender: str
    receiver: str
    payload: Payload
    reply: Payload | None
    summary: str
    headers: tuple[str, ...] = ()


INPUT = Raw("FunctionInput", "the function's input, raw bytes")
OUTPUT = Raw("FunctionOutput", "the function's output, raw bytes; an ErrorBody when the status is not 200")
EMPTY = Raw("Empty", "no payload")
PROMETHEUS = Raw("PrometheusText", "Prometheus's text exposition format", "text/plain; version=0.0.4")
INFO = Raw("NodeInfo", "JSON: name, version, node, scheduler, functions, workers, intake, store", "application/json")
NAME = Raw("SecretName", "JSON: the secret's name", "application/json")


def _ch(id, build, pattern, sender, receiver, payload, reply, summary, headers=()):
    return Channel(id, build, pattern, sender, receiver, payload, reply, summary, tuple(headers))


CHANNELS: list[Channel] = [
    # -- calls and their answers
    _ch("request", lambda s: s.request("NODE", "FN", "CLIENT", "REQ"), "request/reply",
        "broker/client.py (HTTP bridge, CLI, emitter)", "nodes/ingress.py", INPUT, OUTPUT,
        "A direct call: never stored. The answer (the output, or an ErrorBody with its status) comes "
        "from the worker that ran it, or from the node when it refused or relayed it. Published "
        "without a reply subject it is stored as an async call.",
        (H.SENT_AT, H.WAIT, H.TIMEOUT, H.DEADLINE, H.TASK_TYPE, H.TRACING_ID, H.BYPASS, H.FORWARD, H.REJECT)),
    _ch("forward", lambda s: s.forward("NODE", "FN", "CLIENT", "REQ"), "request/reply",
        "nodes/forwarding.py, broker/http/peer.py", "nodes/ingress.py", INPUT, OUTPUT,
        "A call a node hands to a peer. Before the answer, the peer sends empty replies with "
        "`X-P2pfaas-Status: 102` while it holds the call; a peer silent too long fails it (nodes/forwarding.py).",
        (H.HOPS, H.PEERS_LIST_ID, H.PEERS_LIST_IP, H.SCHEDULER_NAME, H.TIMEOUT, H.SENT_AT, H.NOTICES,
         H.DEADLINE, H.WAIT)),
    _ch("async", lambda s: s.async_request("NODE", "FN", "CLIENT", "REQ"), "stored",
        "broker/client.py, broker/mqtt_bridge.py, broker/deadletters.py", "nodes/intake.py, nodes/ingress.py", INPUT, None,
        "A durable call, stored once in FAAS_ASYNC (deduplicated by its message id) and taken by "
        "its node's consumer; acknowledged only once its answer is stored. Devices' MQTT requests "
        "are mapped onto it by nats-server (broker/permissions.py).",
        (H.MSG_ID, H.SENT_AT, H.TIMEOUT, H.DEADLINE, H.TASK_TYPE)),
    _ch("result", lambda s: s.result("CLIENT", "REQ"), "stored", "nodes/answering.py",
        "broker/client.py, broker/mqtt_bridge.py", Result, None,
        "An async call's answer, kept an hour in FAAS_RESULTS (`GET /result/{id}`, callbacks, MQTT "
        "devices through the bridge).", (H.MSG_ID, H.EXPECTED_STREAM)),
    _ch("reject", lambda s: s.reject("CLIENT", "REQ"), "stored",
        "nodes/answering.py, nodes/ingress.py, broker/mqtt_bridge.py",
        "broker/client.py, broker/mqtt_bridge.py", Rejection, None,
        "An async call not run: refused by the algorithm, malformed, or for a node that does not "
        "exist. `faas.reject.invalid` takes those whose caller cannot be named.", (H.MSG_ID, H.EXPECTED_STREAM)),
    _ch("deadletter", lambda s: s.deadletter("NODE", "FN"), "stored", "nodes/answering.py",
        "broker/deadletters.py (p2pfaas dead-letters)", INPUT,
        None, "An async call delivered too many times without an answer, kept seven days for a redrive.",
        (H.DEAD_LETTER_REASON, H.DEAD_LETTER_AT, H.DEAD_LETTER_SUBJECT)),
    # -- a node and its workers
    _ch("worker", lambda s: s.worker("NODE", "WORKER"), "request/reply", "nodes/dispatch.py", "nodes/worker.py",
        WorkerCalls, WorkerOutcomes,
        "A batch of calls for one worker process, framed (a 4-byte length, the JSON, the inputs); "
        "replies are framed outcomes with the async calls' outputs. A direct call's output goes "
        "from the worker to its caller, with the DirectAnswer context the batch carried."),
    _ch("worker-status", lambda s: s.worker_status("NODE", "WORKER"), "request/reply", "nodes/dispatch.py",
        "nodes/worker.py", WorkerStatusRequest, WorkerStatus,
        "After a broker outage or a long call: which of these calls does the worker still run."),
    _ch("gone", lambda s: s.gone("NODE"), "publish", "nodes/node.py, nodes/worker.py",
        "broker/client.py, nodes/forwarding.py, nodes/worker.py", NodeGone, None,
        "A node stopped (or its workers saw it die): calls waiting on it fail at once."),
    _ch("storecheck", lambda s: s.store_check("NODE"), "stored", "nodes/store_check.py", "nobody", EMPTY, None,
        "A periodic write: JetStream can still store (`/healthz` says when it cannot)."),
    # -- the control plane (nodes/control_plane.py serves them; broker/http/ asks)
    _ch("load", lambda s: s.load("NODE"), "request/reply", "nodes/discovery/service.py, broker/http/control.py",
        "nodes/control_plane.py", EMPTY, NodeLoad, "A node's running and queued calls and its limits (P2PFaaS's probe)."),
    _ch("config-get", lambda s: s.config("NODE", "get"), "request/reply", "broker/http/control.py, broker/http_ui.py",
        "nodes/control_plane.py", EMPTY, NodeConfiguration, "The node's K and queue (`GET /configuration`)."),
    _ch("config-set", lambda s: s.config("NODE", "set"), "request/reply", "broker/http/control.py, broker/http_ui.py",
        "nodes/control_plane.py", NodeConfiguration, NodeConfiguration,
        "Change K and the queue at run time; the keys sent replace theirs, the others stay."),
    _ch("scheduler-get", lambda s: s.scheduler_config("NODE", "get"), "request/reply",
        "broker/http/control.py, broker/ui_feed.py", "nodes/control_plane.py", EMPTY, SchedulerConfiguration,
        "The node's scheduling algorithm and its parameters."),
    _ch("scheduler-set", lambda s: s.scheduler_config("NODE", "set"), "request/reply",
        "broker/http/control.py, broker/http_ui.py", "nodes/control_plane.py", SchedulerChange, SchedulerConfiguration,
        "Change the algorithm at run time (400 with the reason for an unknown one)."),
    _ch("metrics", lambda s: s.metrics("NODE"), "request/reply", "broker/http/control.py", "nodes/control_plane.py",
        EMPTY, PROMETHEUS, "The node's metrics (`GET /metrics`)."),
    _ch("info", lambda s: s.info("NODE"), "request/reply", "broker/http/control.py, p2pfaas/healthcheck.py",
        "nodes/control_plane.py", EMPTY, INFO,
        "What `/healthz` judges: the intake and the store are ok."),
    _ch("peers", lambda s: s.peers("NODE"), "request/reply", "broker/http/control.py, broker/http/discovery.py",
        "nodes/discovery/service.py", EMPTY, PeerList, "The node's live peers (P2PFaaS's `GET /list`)."),
    _ch("discovery-register", lambda s: s.discovery("NODE", "register"), "request/reply",
        "broker/http/discovery.py", "nodes/discovery/service.py", MachineAnnouncement, PeerList,
        "A P2PFaaS machine announces itself over HTTP (port 19000)."),
    _ch("discovery-config-set", lambda s: s.discovery("NODE", "config.set"), "request/reply",
        "broker/http/discovery.py", "nodes/discovery/service.py", DiscoveryConfiguration, DiscoveryConfiguration,
        "P2PFaaS's discovery settings (`config.get` reads them, `reset` forgets the peers)."),
    _ch("functions-list", lambda s: s.functions("NODE", "list"), "request/reply",
        "broker/http/openfaas.py, p2pfaas/cli_functions.py", "nodes/deployments.py", EMPTY, FunctionList,
        "The node's functions (OpenFaaS's `GET /system/functions`)."),
    _ch("functions-deploy", lambda s: s.functions("NODE", "deploy"), "request/reply",
        "broker/http/openfaas.py, p2pfaas/cli_functions.py", "nodes/deployments.py", FunctionDeployment,
        FunctionInfo, "Deploy on every node: a key in the FAAS_FUNCTIONS bucket, applied by each node."),
    _ch("functions-scale", lambda s: s.functions("NODE", "scale"), "request/reply",
        "broker/http/openfaas.py", "nodes/deployments.py", FunctionScale, FunctionInfo,
        "A function's replicas (`delete` removes it; `scale_delay` measures a scale-up: ScaleDelay)."),
    _ch("secrets-set", lambda s: s.functions("NODE", "secrets_set"), "request/reply",
        "broker/http/openfaas.py, p2pfaas/cli_secrets.py", "nodes/secrets.py", SecretChange, NAME,
        "Seal a secret into FAAS_SECRETS (`secrets_list` names them, `secrets_delete` removes one)."),
    # -- membership, telemetry and scaling
    _ch("membership", lambda s: s.membership("NODE", "GROUP"), "publish", "nodes/discovery/service.py",
        "nodes/discovery/service.py, nodes/worker.py, broker/ui_feed.py", Heartbeat, None,
        "Heartbeats within a P2PFaaS group: who is alive, its load and its algorithm."),
    _ch("telemetry", lambda s: s.telemetry("NODE", "POOL"), "publish", "nodes/pool_reports.py",
        "controller/live.py, broker/ui_feed.py, p2pfaas/top.py", PoolTelemetry, None,
        "A pool's control period: arrivals, queue, workers, latency, QoS."),
    _ch("pulse", lambda s: s.pulse("NODE", "POOL"), "publish", "nodes/pool_reports.py", "controller/live.py",
        PoolPulse, None, "Every 2 s between long control periods: what the panic rule reacts to."),
    _ch("scale", lambda s: s.scale("NODE", "POOL"), "publish", "controller/live.py, broker/http_ui.py",
        "nodes/node.py", ScaleCommand, None, "A pool's target: the main pool's K, or a pool's workers."),
    _ch("policy", lambda s: s.pool_policy("NODE", "POOL"), "request/reply", "broker/http_ui.py", "controller/live.py",
        PolicySwitch, PolicySwitched, "Switch the scaling policy of a pool's controller."),
    # -- learning
    _ch("reward", lambda s: s.reward("NODE"), "stored", "nodes/scheduler/rewards.py, broker/http/learner.py",
        "nodes/learner/node_learner.py", SchedulingExperience, None,
        "A scheduling decision's reward, in the node's FAAS_EXP_<node> stream.", (H.MSG_ID,)),
    _ch("experience", lambda s: s.experience("NODE", "POOL"), "stored", "controller/live.py",
        "nodes/learner/node_learner.py", ScalingExperience, None,
        "A scaling decision and what followed it: the learner trains the pool's model on it."),
    _ch("learner-act", lambda s: s.learner("NODE", "MODEL", "act"), "request/reply",
        "nodes/learner/client.py, broker/http/learner.py", "nodes/learner/node_learner.py", LearnerActRequest,
        LearnerAction, "An action for a state (P2PFaaS's learner `/act`)."),
    _ch("learner-weights-set", lambda s: s.learner("NODE", "MODEL", "weights.set"), "request/reply",
        "controller/live.py", "nodes/learner/node_learner.py", LearnerWeights, LearnerStats,
        "Seed a model (`weights.get` reads them; `parameters.get|set`, `stats`, `reset` as P2PFaaS's learner)."),
    _ch("learner-weights", lambda s: s.learner("NODE", "MODEL", "weights"), "publish",
        "nodes/learner/node_learner.py", "nodes/learner/client.py, controller/live.py", LearnerWeights, None,
        "A model's new weights, for the policies that act on them locally."),
]


def placeholders(subject: str) -> str:
    for token, name in PLACEHOLDERS.items():
        subject = re.sub(rf"(?<![A-Za-z0-9_-]){token}(?![A-Za-z0-9_-])", "{" + name + "}", subject)
    return subject


def subject_of(channel: Channel) -> str:
    """The channel's subject with ``{placeholders}``, built by :class:`Subjects` itself."""
    return placeholders(channel.build(Subjects(DEFAULT_PREFIX)))
