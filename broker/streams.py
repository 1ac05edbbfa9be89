"""JetStream stream provisioning: names, subjects and limits of every durable stream. Only async work is
stored (intake, answers, dead letters, experiences), never direct calls. Whoever needs a stream ensures it."""

from __future__ import annotations

import asyncio
import logging

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from broker.settings import broker_settings
from broker.subjects import Subjects

log = logging.getLogger(__name__)

DUPLICATE_WINDOW_S = 120.0
RESULT_MAX_AGE_S = 3600.0
DEADLETTER_MAX_AGE_S = 7 * 24 * 3600.0
EXPERIENCE_MAX_AGE_S = 7 * 24 * 3600.0
JETSTREAM_READY_TIMEOUT_S = 30.0  # a fresh NATS cluster elects its JetStream leader first
# Bounds: a full intake refuses new work; full answer, dead-letter, experience streams drop their oldest
MIB = 1024 * 1024
ASYNC_MAX_BYTES = 512 * MIB
ASYNC_MAX_MSGS = 1_000_000
RESULT_MAX_BYTES = 512 * MIB
DEADLETTER_MAX_BYTES = 128 * MIB
EXPERIENCE_MAX_BYTES = 256 * MIB
# On a store too small for these (nats-server reserves a stream's max_bytes when it is made: error
# 10047), a stream takes this share of the room the store still has (docs/security.md)
ASYNC_SHARE, RESULT_SHARE, DEADLETTER_SHARE, EXPERIENCE_SHARE = 1 / 3, 1 / 3, 1 / 8, 1 / 8
STORE_CHECK_SHARE = 1 / 64
MIN_STREAM_BYTES = MIB
INSUFFICIENT_STORAGE = 10047


def stream_names(subjects: Subjects) -> str:
    """The common start of every stream name of a prefix (for listing or cleaning them up)."""
    return subjects.prefix.upper() + "_"


def _name(subjects: Subjects, *parts: str) -> str:
    return "_".join((subjects.prefix.upper(), *parts))


def async_stream(subjects: Subjects) -> str:
    """Every node's durable intake; node ``n`` consumes ``<prefix>.async.<n>.>``."""
    return _name(subjects, "ASYNC")


def results_stream(subjects: Subjects) -> str:
    return _name(subjects, "RESULTS")


def deadletter_stream(subjects: Subjects) -> str:
    return _name(subjects, "DEADLETTER")


def store_check_stream(subjects: Subjects) -> str:
    return _name(subjects, "STORECHECK")


def experiences_stream(subjects: Subjects, node: str) -> str:
    return _name(subjects, "EXP", node)


def stream_replicas() -> int:
    """Replicas of every stream: ``P2PFAAS_STREAM_REPLICAS`` (``broker.settings``)."""
    return broker_settings().stream_replicas


_COMPARED = ("subjects", "retention", "storage", "max_bytes", "max_msgs", "max_age", "duplicate_window", "discard",
             "allow_direct", "num_replicas")


JETSTREAM_WAIT_S = 15.0   # JetStream's API answered by nobody (starting, or accounts reloading) this long: an error


async def _ensure(js: JetStreamContext, config: StreamConfig, share: float) -> None:
    """``_ensure_once``, again while JetStream's API has no responder (accounts reloading, starting)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + JETSTREAM_WAIT_S
    while True:
        try:
            return await _ensure_once(js, config, share)
        except ServiceUnavailableError:
            if loop.time() >= deadline:
                raise
            log.info("stream %s: JetStream does not answer yet; trying again", config.name)
            await asyncio.sleep(0.2)


async def _ensure_once(js: JetStreamContext, config: StreamConfig, share: float) -> None:
    """Create the stream, or bring an existing one to ``config`` (one that has it is left alone: adding
    it again would reserve its ``max_bytes`` twice). With no room for ``max_bytes``, it gets ``share``."""
    config.num_replicas = config.num_replicas or stream_replicas()
    current: StreamConfig | None = None
    try:
        current = (await js.stream_info(config.name)).config
    except NotFoundError:
        try:
            return await _fitted(js, js.add_stream, config, share, None)
        except BadRequestError as exc:
            if exc.err_code != 10058:   # 10058: made meanwhile by another node, with another config
                raise
    else:
        # a duplicate window of 0 asks for the server's default (2 min), which the server then reports;
        # a stream fitted to a small store keeps its size (asking for more would fail again)
        wanted = {f: getattr(config, f, None) for f in _COMPARED}
        if not wanted["duplicate_window"]:
            wanted["duplicate_window"] = None
        if current.max_bytes and wanted["max_bytes"] and 0 < current.max_bytes < wanted["max_bytes"]:
            wanted["max_bytes"] = None
        if all(_same(getattr(current, f, None), wanted[f]) for f in _COMPARED):
            return
    await _fitted(js, js.update_stream, config, share, current)


async def _fitted(js: JetStreamContext, make, config: StreamConfig, share: float, current: StreamConfig | None) -> None:
    """``make(config)``; with no room for ``max_bytes``, ``share`` of the largest size that fits."""
    wanted = config.max_bytes
    try:
        await make(config)
        return
    except APIError as exc:
        if exc.err_code != INSUFFICIENT_STORAGE or not wanted or wanted <= MIN_STREAM_BYTES:
            raise
    size = wanted
    while True:
        size //= 2
        config.max_bytes = max(size, MIN_STREAM_BYTES)
        try:
            await make(config)
            break
        except APIError as exc:
            if exc.err_code != INSUFFICIENT_STORAGE or size <= MIN_STREAM_BYTES:
                raise
    kept = max(MIN_STREAM_BYTES, int(size * share), (current.max_bytes or 0) if current else 0)
    if kept < config.max_bytes:
        config.max_bytes = kept
        await js.update_stream(config)   # made at the size that fitted: down to its share
    log.warning("stream %s: the JetStream store has room for about %d MiB, not %d MiB: limited to %d MiB",
                config.name, size // MIB, wanted // MIB, config.max_bytes // MIB)


def _same(current, wanted) -> bool:
    if wanted is None:
        return True      # not ours to set: whatever the stream has
    if isinstance(wanted, list):
        return sorted(current or []) == sorted(wanted)
    if isinstance(wanted, float) or isinstance(current, float):
        return current is not None and abs(float(current) - float(wanted)) < 1e-6
    return current == wanted


def shared_streams(subjects: Subjects) -> list[tuple[StreamConfig, float]]:
    """The streams every node shares, each with its share of a store too small for its ``max_bytes``."""
    return [
        (StreamConfig(name=async_stream(subjects), subjects=[subjects.all_async()], storage=StorageType.FILE,
                      retention=RetentionPolicy.WORK_QUEUE, duplicate_window=DUPLICATE_WINDOW_S,
                      discard=DiscardPolicy.NEW, max_bytes=ASYNC_MAX_BYTES, max_msgs=ASYNC_MAX_MSGS), ASYNC_SHARE),
        (StreamConfig(name=results_stream(subjects), subjects=[subjects.all_results(), subjects.all_rejects()],
                      storage=StorageType.FILE, max_age=RESULT_MAX_AGE_S, max_bytes=RESULT_MAX_BYTES,
                      duplicate_window=DUPLICATE_WINDOW_S, allow_direct=True), RESULT_SHARE),
        (StreamConfig(name=deadletter_stream(subjects), subjects=[subjects.all_deadletters()],
                      storage=StorageType.FILE, max_age=DEADLETTER_MAX_AGE_S, max_bytes=DEADLETTER_MAX_BYTES),
         DEADLETTER_SHARE),
        (StreamConfig(name=store_check_stream(subjects), subjects=[subjects.all_store_checks()],
                      storage=StorageType.FILE, max_msgs_per_subject=1, max_bytes=MIN_STREAM_BYTES),
         STORE_CHECK_SHARE),
    ]


def node_streams(subjects: Subjects, node: str) -> list[tuple[StreamConfig, float]]:
    """A node's own stream: the rewards and experiences its learner learns from."""
    return [(StreamConfig(name=experiences_stream(subjects, node),
                          subjects=[subjects.reward(node), subjects.experiences_of(node)], storage=StorageType.FILE,
                          max_age=EXPERIENCE_MAX_AGE_S, max_bytes=EXPERIENCE_MAX_BYTES), EXPERIENCE_SHARE)]


async def ensure_shared_streams(js: JetStreamContext, subjects: Subjects) -> None:
    for config, share in shared_streams(subjects):
        await _ensure(js, config, share)


async def ensure_node_streams(js: JetStreamContext, subjects: Subjects, node: str) -> None:
    """The shared streams and the node's own."""
    for config, share in (*shared_streams(subjects), *node_streams(subjects, node)):
        await _ensure(js, config, share)


async def when_jetstream_ready(action, timeout_s: float = JETSTREAM_READY_TIMEOUT_S) -> None:
    """Run ``action``, retrying while a clustered JetStream has no meta leader yet (503)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await action()
        except (APIError, asyncio.TimeoutError) as exc:
            retryable = (isinstance(exc, (asyncio.TimeoutError, ServiceUnavailableError))
                         or getattr(exc, "code", None) == 503)
            if not retryable or loop.time() > deadline:
                raise
            log.info("JetStream not ready yet (%s); retrying", exc)
            await asyncio.sleep(0.25)


class StreamRemaker:
    """A store failed: if its stream is gone (``nats stream rm``, a store restored without it), the shared
    streams are made again. A missing stream may look like silence: JetStream is asked every ``period_s``."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, who: str, period_s: float = 10.0) -> None:
        self.js, self.subjects, self.who, self.period_s = js, subjects, who, period_s
        self._at = -period_s

    async def remade(self, exc: Exception, stream: str) -> bool:
        """True if ``stream`` was gone and the shared streams were made again."""
        now = asyncio.get_running_loop().time()
        if now - self._at < self.period_s:
            return False
        self._at = now
        try:
            await self.js.stream_info(stream)
            return False   # it exists: JetStream is busy, or the disk full
        except NotFoundError:
            pass
        except Exception as error:   # JetStream itself is away: the usual retry
            log.debug("%s: stream %s not looked up (%s, after %r)", self.who, stream, error, exc)
            return False
        try:
            await ensure_shared_streams(self.js, self.subjects)
        except Exception as error:
            log.warning("%s: stream %s is gone and could not be made again: %s", self.who, stream, error)
            return False
        log.warning("%s: stream %s was gone (nothing could be stored in it): the shared streams were made again",
                    self.who, stream)
        return True
