"""Workers as Docker containers on the engine ``DOCKER_HOST`` names. Labels (prefix, node, pool,
worker) let a restarted node adopt or remove its own containers and never touch anyone else's."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from typing import Any, Callable, Mapping, TypeVar

import docker
from docker.errors import APIError, NotFound
from docker.models.containers import Container

from nodes.settings import DEFAULT_WORKER_IMAGE, NodeSettings

log = logging.getLogger(__name__)

LABEL_PREFIX = "p2pfaas.prefix"
LABEL_NODE = "p2pfaas.node"
LABEL_POOL = "p2pfaas.pool"
LABEL_WORKER = "p2pfaas.worker"
LABEL_ROLE = "p2pfaas.role"          # "worker", or "function" for an image function's container
WORKER_COMMAND = ("python", "-m", "nodes.worker")
READY_LINE = b"READY"                # what nodes.worker prints once it is connected and bound
CONTAINER_SOCKET = "/var/run/docker.sock"

T = TypeVar("T")


class WorkerExited(RuntimeError):
    """The container exited before its worker said READY."""

    def __init__(self, name: str, code: int | None) -> None:
        super().__init__(f"worker container {name} exited with code {code} before it was ready")
        self.code = code


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking SDK call in a daemon thread and await its result. Not ``asyncio.to_thread``:
    calls that block for a container's life would fill the default executor, which ``asyncio.run`` joins."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)

    def run() -> None:
        try:
            result, exc = fn(*args, **kwargs), None
        except BaseException as error:  # handed to the awaiting coroutine
            result, exc = None, error
        try:
            loop.call_soon_threadsafe(settle, result, exc)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
            pass

    threading.Thread(target=run, name=f"docker-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await future


def owned_labels(prefix: str, node: str, pool: str) -> dict[str, str]:
    """The labels that make a container this node's and this pool's."""
    return {LABEL_PREFIX: prefix, LABEL_NODE: node, LABEL_POOL: pool}


def _label_filter(labels: Mapping[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in labels.items()]


LIST_TRIES = 5


def list_containers(client: docker.DockerClient, labels: Mapping[str, str]) -> list[Container]:
    """The containers (any state) carrying every one of ``labels`` (blocking). Listed again on
    NotFound: docker-py inspects each listed container, and one may be removed in between."""
    for attempt in range(LIST_TRIES):
        try:
            return client.containers.list(all=True, filters={"label": _label_filter(labels)})
        except NotFound:
            if attempt == LIST_TRIES - 1:
                raise
    raise AssertionError("unreachable")


class DockerWorker:
    """One worker container, quacking like ``asyncio.subprocess.Process`` where a pool needs it;
    removed once it exits, with the function containers it started."""

    def __init__(self, runtime: "DockerWorkerRuntime", container: Container, name: str) -> None:
        self.runtime = runtime
        self.container = container
        self.name = name
        self.id: str = container.id
        self.returncode: int | None = None
        self.stop_requested = False
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._signals: set[asyncio.Task] = set()
        self._watcher = asyncio.create_task(self._watch(), name=f"watch-{name}")

    # -- lifecycle ------------------------------------------------------------------
    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the worker printed READY; TimeoutError, or WorkerExited if it died first."""
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(self._ready)

    async def ready_or_exit(self) -> bool:
        """True once the worker is ready, False if the container exited first."""
        try:
            await asyncio.shield(self._ready)
            return True
        except WorkerExited:
            return False

    async def wait(self) -> int:
        """The container's exit code, once it exited (and was removed)."""
        return await asyncio.shield(self._exited)

    async def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM (the worker finishes its task), SIGKILL after ``grace_s``; the exit code."""
        self.stop_requested = True
        if not self._exited.done():
            try:
                await blocking(self.container.stop, timeout=max(0, int(round(grace_s))))
            except NotFound:  # already gone
                pass
        return await self.wait()

    def send_signal(self, sig: int) -> None:
        """Signal the worker (not waiting for the engine), as ``Process.send_signal`` does."""
        if sig == signal.SIGTERM:
            self.stop_requested = True
        if self._exited.done():
            return
        task = asyncio.get_running_loop().create_task(self._signal(sig))
        self._signals.add(task)
        task.add_done_callback(self._signals.discard)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL now: the task it was running is redelivered by JetStream."""
        self.send_signal(signal.SIGKILL)

    async def _signal(self, sig: int) -> None:
        try:
            await blocking(self.container.kill, signal=int(sig))
        except (NotFound, APIError) as exc:  # not running (any more): nothing to signal
            log.debug("signal %s to %s: %s", sig, self.name, exc)

    # -- watching -------------------------------------------------------------------
    async def _watch(self) -> None:
        code: int | None = None
        try:
            if await blocking(self._follow_until_ready):
                self._ready.set_result(None)
            status = await blocking(self.container.wait)
            code = int(status.get("StatusCode", -1))
        except NotFound:  # removed under us (by hand, or a stray cleanup)
            code = -1
        except Exception as exc:  # the engine went away: report the worker as dead
            log.warning("lost track of worker container %s: %s", self.name, exc)
            code = -1
        finally:
            self.returncode = code
            if not self._ready.done():
                self._ready.set_exception(WorkerExited(self.name, code))
                self._ready.exception()  # retrieved: nobody has to await it
            await self._cleanup(code)
            self._exited.set_result(code if code is not None else -1)

    def _follow_until_ready(self) -> bool:
        """Read the container's stdout until READY (True) or its end (False)."""
        pending = b""
        stream = self.container.logs(stream=True, follow=True, stdout=True, stderr=False)
        try:
            for chunk in stream:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if any(line.strip() == READY_LINE for line in lines):
                    return True
            return pending.strip() == READY_LINE
        finally:
            stream.close()

    async def _cleanup(self, code: int | None) -> None:
        if code not in (0, None) and not self.stop_requested:
            try:
                tail = await blocking(self.container.logs, stdout=False, stderr=True, tail=20)
                log.warning("worker container %s exited with %s:\n%s", self.name, code,
                            tail.decode(errors="replace").rstrip())
            except (NotFound, APIError):
                pass
        try:
            await blocking(self.container.remove, force=True)
        except (NotFound, APIError):  # removed already (or being removed)
            pass
        await self.runtime.remove_function_containers(self.name)


class DockerWorkerRuntime:
    """Starts a pool's workers as containers of ``image`` (``--network host``, only the ``P2PFAAS_*``
    variables: the host's PATH or HOME would break the image's). ``docker_socket`` lends the engine
    to the workers (image functions need it); it is root on the engine, so it is off by default."""

    def __init__(self, client: docker.DockerClient, image: str = DEFAULT_WORKER_IMAGE, node: str = "n1",
                 pool: str = "default", *, prefix: str = "faas", network: str = "host",
                 docker_socket: bool = False, command: tuple[str, ...] = WORKER_COMMAND,
                 memory_bytes: int | None = None, cpus: float | None = None) -> None:
        self.client = client
        self.memory_bytes, self.cpus = memory_bytes, cpus   # each worker container's (a function pool's limits)
        self.image = image
        self.node = node
        self.pool = pool
        self.prefix = prefix
        self.network = network
        self.docker_socket = docker_socket
        self.command = command

    @classmethod
    def from_env(cls, **kwargs: Any) -> "DockerWorkerRuntime":
        """A runtime on the engine ``DOCKER_HOST`` names (or the default socket)."""
        return cls(docker.from_env(), **kwargs)

    @property
    def labels(self) -> dict[str, str]:
        return owned_labels(self.prefix, self.node, self.pool)

    def container_name(self, worker: str) -> str:
        return f"p2pfaas-{self.prefix}-{worker}"

    async def start(self, name: str, env: Mapping[str, str]) -> DockerWorker:
        """Start worker ``name``; await ``wait_ready`` on the result before counting on it."""
        container = await blocking(self._run, name, dict(env))
        return DockerWorker(self, container, name)

    def _run(self, name: str, env: dict[str, str]) -> Container:
        cname = self.container_name(name)
        self._remove_stale(cname)
        environment = {k: v for k, v in env.items() if k.startswith("P2PFAAS_")}
        volumes, groups = {}, []
        if self.docker_socket:
            environment.update(_engine_environment())
            socket = _engine_socket()
            if socket is not None:
                volumes[socket] = {"bind": CONTAINER_SOCKET, "mode": "rw"}
                groups.append(os.stat(socket).st_gid)  # the image's user is not root: the socket's group
        limits: dict[str, int] = {}
        if self.memory_bytes:
            limits["mem_limit"] = self.memory_bytes
        if self.cpus:
            limits["nano_cpus"] = int(self.cpus * 1e9)
        return self.client.containers.run(
            self.image, entrypoint=list(self.command), name=cname,
            labels={**self.labels, LABEL_WORKER: name, LABEL_ROLE: "worker"},
            environment=environment, network_mode=self.network, volumes=volumes, group_add=groups,
            detach=True, stop_signal="SIGTERM", **limits,
        )

    def _remove_stale(self, cname: str) -> None:
        """A container left under this name by an earlier run of this node/pool goes; anyone else's is an error."""
        try:
            old = self.client.containers.get(cname)
        except NotFound:
            return
        theirs = {k: old.labels.get(k) for k in self.labels}
        if theirs != self.labels:
            raise RuntimeError(f"container {cname} exists and is not this pool's (labels {theirs}); not touching it")
        log.info("removing stale worker container %s", cname)
        old.remove(force=True)

    async def containers(self, role: str | None = None) -> list[Container]:
        """This node/pool's containers (any state), optionally of one role."""
        labels = dict(self.labels, **({LABEL_ROLE: role} if role else {}))
        return await blocking(list_containers, self.client, labels)

    async def adopt_or_remove(self, keep: int = 0) -> list[DockerWorker]:
        """Leftovers of an earlier run of this node/pool: adopt up to ``keep`` running workers, remove
        the others (the label filter is exact: nobody else's are touched)."""
        adopted: list[DockerWorker] = []
        workers = sorted(await self.containers("worker"), key=lambda c: c.labels.get(LABEL_WORKER, ""))
        for container in workers:
            if container.status == "running" and len(adopted) < keep:
                log.info("adopting worker container %s", container.name)
                adopted.append(DockerWorker(self, container, container.labels.get(LABEL_WORKER, container.name)))
                continue
            log.info("removing stray worker container %s (%s)", container.name, container.status)
            await _remove_quietly(container)
        kept = {w.name for w in adopted}
        for container in await self.containers("function"):
            if container.labels.get(LABEL_WORKER) not in kept:
                await _remove_quietly(container)
        return adopted

    async def remove_function_containers(self, worker: str) -> None:
        """The image-function containers that worker ``worker`` started (it is gone)."""
        labels = dict(self.labels, **{LABEL_WORKER: worker, LABEL_ROLE: "function"})
        try:
            found = await blocking(list_containers, self.client, labels)
        except APIError as exc:
            log.warning("cannot list function containers of %s: %s", worker, exc)
            return
        for container in found:
            await _remove_quietly(container)


async def pool_runtime(settings: "NodeSettings", pool: str) -> DockerWorkerRuntime:
    """The runtime of one pool of a node, strays of an earlier run removed; the engine is lent to
    the workers only when the node has image functions."""
    from functions.image import IMAGE_SCHEME

    def connect() -> docker.DockerClient:
        client = docker.from_env()
        try:
            client.images.get(settings.docker_image)
        except docker.errors.ImageNotFound:
            raise RuntimeError(f"worker image {settings.docker_image} is not on the Docker engine "
                               f"({os.environ.get('DOCKER_HOST', 'default socket')}): run `p2pfaas image build`") from None
        return client

    spec = settings.pools.get(pool)
    runtime = DockerWorkerRuntime(
        await blocking(connect), settings.docker_image, settings.node_id, pool, prefix=settings.prefix,
        network=settings.docker_network, docker_socket=any(ref.startswith(IMAGE_SCHEME) for _, ref in settings.functions),
        memory_bytes=spec.memory_bytes if spec else None, cpus=spec.cpus if spec else None)
    await runtime.adopt_or_remove(keep=0)
    return runtime


async def _remove_quietly(container: Container) -> None:
    try:
        await blocking(container.remove, force=True)
    except (NotFound, APIError) as exc:  # gone already, or removal in progress
        log.debug("removing %s: %s", container.name, exc)


def _engine_socket() -> str | None:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def _engine_environment() -> dict[str, str]:
    """How a container reaches the engine lent to it: the mounted socket, or DOCKER_HOST as is (tcp)."""
    if _engine_socket() is not None:
        return {"DOCKER_HOST": f"unix://{CONTAINER_SOCKET}"}
    return {"DOCKER_HOST": os.environ["DOCKER_HOST"]}


__all__ = ["DockerWorker", "DockerWorkerRuntime", "WorkerExited", "DEFAULT_WORKER_IMAGE", "owned_labels", "pool_runtime",
           "LABEL_NODE", "LABEL_POOL", "LABEL_WORKER", "LABEL_PREFIX", "LABEL_ROLE", "blocking"]
