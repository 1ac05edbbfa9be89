"""JetStream stream provisioning: names, subjects and limits of every durable stream.

Idempotent: every component that needs a stream calls :func:`ensure_node_streams`
or :func:`ensure_shared_streams`; the first one creates it, later ones reuse it.
"""

from __future__ import annotations

import logging
import os

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from broker.subjects import Subjects

log = logging.getLogger(__name__)

DUPLICATE_WINDOW_S = 120.0
RESULT_MAX_AGE_S = 3600.0
DEADLETTER_MAX_AGE_S = 7 * 24 * 3600.0
EXPERIENCE_MAX_AGE_S = 7 * 24 * 3600.0


def _name(subjects: Subjects, *parts: str) -> str:
    return "_".join((subjects.prefix.upper(), *parts))


def requests_stream(subjects: Subjects, node: str) -> str:
    return _name(subjects, "REQ", node)


def tasks_stream(subjects: Subjects, node: str) -> str:
    return _name(subjects, "TASK", node)


def results_stream(subjects: Subjects) -> str:
    return _name(subjects, "RESULTS")


def deadletter_stream(subjects: Subjects) -> str:
    return _name(subjects, "DEADLETTER")


def experiences_stream(subjects: Subjects, node: str) -> str:
    return _name(subjects, "EXP", node)


def stream_replicas() -> int:
    """Replicas of every stream: ``P2PFAAS_STREAM_REPLICAS`` (default 1; 3 in compose.yaml's cluster)."""
    value = os.environ.get("P2PFAAS_STREAM_REPLICAS", "1")
    if not value.isdigit() or not 1 <= int(value) <= 5:
        raise ValueError(f"P2PFAAS_STREAM_REPLICAS must be 1..5 (JetStream's limit), got {value!r}")
    return int(value)


async def _ensure(js: JetStreamContext, config: StreamConfig) -> None:
    config.num_replicas = config.num_replicas or stream_replicas()
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        # 10058: exists with a different config -> bring it to ours.
        if exc.err_code == 10058:
            await js.update_stream(config)
        else:
            raise


async def ensure_shared_streams(js: JetStreamContext, subjects: Subjects) -> None:
    await _ensure(js, StreamConfig(
        name=results_stream(subjects),
        subjects=[subjects.all_results(), subjects.all_rejects()],
        storage=StorageType.FILE,
        max_age=RESULT_MAX_AGE_S,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_direct=True,
    ))
    await _ensure(js, StreamConfig(
        name=deadletter_stream(subjects),
        subjects=[subjects.all_deadletters()],
        storage=StorageType.FILE,
        max_age=DEADLETTER_MAX_AGE_S,
    ))


async def ensure_node_streams(js: JetStreamContext, subjects: Subjects, node: str) -> None:
    """Request/forward stream and task queue of ``node`` (work-queue retention)."""
    await ensure_shared_streams(js, subjects)
    await _ensure(js, StreamConfig(
        name=requests_stream(subjects, node),
        subjects=[subjects.requests_of(node), subjects.forwards_of(node)],
        storage=StorageType.FILE,
        retention=RetentionPolicy.WORK_QUEUE,
        duplicate_window=DUPLICATE_WINDOW_S,
        discard=DiscardPolicy.NEW,
    ))
    await _ensure(js, StreamConfig(
        name=tasks_stream(subjects, node),
        subjects=[subjects.tasks_of(node)],
        storage=StorageType.FILE,
        retention=RetentionPolicy.WORK_QUEUE,
        duplicate_window=DUPLICATE_WINDOW_S,
    ))
    await _ensure(js, StreamConfig(
        name=experiences_stream(subjects, node),
        subjects=[subjects.reward(node), subjects._join(node, "experience", ">")],
        storage=StorageType.FILE,
        max_age=EXPERIENCE_MAX_AGE_S,
    ))
