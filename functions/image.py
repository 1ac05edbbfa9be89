"""Functions as container images, OpenFaaS style (``--function name=image:<ref>``): a worker starts
one container of the image for itself at its first call, POSTs every payload to it (the watchdog
convention: body in, body out, port ``$port``, default 8080) and removes it when it exits."""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from functions.spec import FunctionInputError
from functions.secrets import given as given_secrets

log = logging.getLogger(__name__)

IMAGE_SCHEME = "image:"
SECRETS_DIR = "/var/openfaas/secrets"   # OpenFaaS's: one file per secret
IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._/:@-]{0,254}$")
WATCHDOG_PORT = 8080
HEALTH_PATH = "/_/health"


def parse_image_reference(reference: str) -> str | None:
    """``image:<ref>`` -> ``<ref>`` (ValueError if malformed); None for any other reference."""
    if not reference.startswith(IMAGE_SCHEME):
        return None
    image = reference[len(IMAGE_SCHEME):]
    if not IMAGE_REF.match(image):
        raise ValueError(f"image reference {image!r} must look like [registry/]name[:tag] (lower case)")
    return image


ENGINE_CHECK_TIMEOUT_S = 3.0


def check_engine(image: str, build: str = "p2pfaas image build --target function") -> None:
    """The engine that would run ``image`` answers and has it, or ValueError saying what to do
    (``build``: the command that makes it); checked when the function is added, not at its first call."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    engine = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=ENGINE_CHECK_TIMEOUT_S)
    except DockerException as exc:
        raise ValueError(f"no Docker engine at {engine} to run {image} ({_first_line(exc)}): start one, "
                         "or name it with DOCKER_HOST") from None
    try:
        client.ping()
        client.images.get(image)
    except ImageNotFound:
        raise ValueError(f"image {image} is not on the Docker engine at {engine}: build it ({build}) or pull "
                         f"it (docker pull {image})") from None
    except (DockerException, OSError) as exc:
        raise ValueError(f"the Docker engine at {engine} does not answer ({_first_line(exc)}): start it, or "
                         "name another with DOCKER_HOST") from None
    finally:
        client.close()


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _owner() -> dict[str, str]:
    """Labels naming the worker process this function runs in (from the worker's environment)."""
    try:
        settings = json.loads(os.environ.get("P2PFAAS_NODE_SETTINGS", "{}"))
    except ValueError:
        settings = {}
    return {
        "p2pfaas.prefix": str(settings.get("prefix", "faas")),
        "p2pfaas.node": str(settings.get("node_id", "n1")),
        "p2pfaas.pool": os.environ.get("P2PFAAS_WORKER_POOL", "default"),
        "p2pfaas.worker": os.environ.get("P2PFAAS_WORKER_NAME", f"pid{os.getpid()}"),
    }


def _secrets_archive(secrets: dict[str, str]) -> bytes:
    """A tar of one file per secret (readable by the container's user, whoever it is)."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, value in sorted(secrets.items()):
            data = value.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o444, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ImageFunction:
    """The body of an image function, through this worker's container. ``network``: ``host`` (it
    listens on a free host port given as ``$port``) or a Docker network (its 8080 published on a free
    127.0.0.1 port). A 4xx answer is the caller's fault (400), anything else non-200 the function's (500)."""

    def __init__(self, name: str, image: str, *, timeout_s: float = 60.0, start_timeout_s: float = 60.0,
                 network: str | None = None, environment: dict[str, str] | None = None) -> None:
        self.name = name
        self.image = image
        self.environment = dict(environment or {})   # its envVars, in its container
        self.memory_bytes: int | None = None          # its container's limits (a deployment's)
        self.cpus: float | None = None
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.network = network or os.environ.get("P2PFAAS_FUNCTION_NETWORK", "host")
        self._lock = threading.Lock()
        self._client: Any = None
        self._container: Any = None
        self._url = ""
        self._closing_registered = False
        self._secrets_volume: Any = None

    def __call__(self, payload: bytes) -> bytes:
        with self._lock:  # one worker runs one task at a time; the lock guards the start only
            url = self._ensure_running()
        request = urllib.request.Request(url, data=payload, method="POST",
                                         headers={"Content-Type": "application/octet-stream"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return answer.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()[:500].decode(errors="replace")
            if 400 <= exc.code < 500:
                raise FunctionInputError(f"{self.image} answered {exc.code}: {body}") from None
            raise RuntimeError(f"{self.image} answered {exc.code}: {body}") from None
        except (urllib.error.URLError, ConnectionError) as exc:
            raise RuntimeError(f"function container of {self.image} unreachable: {exc}") from None

    # -- the container ------------------------------------------------------------------
    @property
    def container_name(self) -> str:
        owner = _owner()
        return f"p2pfaas-{owner['p2pfaas.prefix']}-{owner['p2pfaas.worker']}-fn-{self.name}"

    def _ensure_running(self) -> str:
        if self._container is not None:
            try:
                self._container.reload()
                if self._container.status == "running":
                    return self._url
                log.warning("function container %s is %s; starting a new one", self._container.name,
                            self._container.status)
            except Exception as exc:  # removed under us: start another
                log.warning("function container of %s lost: %s", self.image, exc)
            self.close()
        self._start()
        return self._url

    def _start(self) -> None:
        import docker  # only workers that run image functions need the SDK
        from docker.errors import NotFound

        if self._client is None:
            self._client = docker.from_env()
        labels = {**_owner(), "p2pfaas.role": "function", "p2pfaas.function": self.name}
        name = self.container_name
        try:
            stale = self._client.containers.get(name)
            if all(stale.labels.get(k) == v for k, v in labels.items()):
                stale.remove(force=True)
            else:
                raise RuntimeError(f"container {name} exists and is not this worker's; not touching it")
        except NotFound:
            pass
        kwargs: dict[str, Any] = dict(name=name, labels=labels, detach=True, network_mode=self.network,
                                      environment=dict(self.environment))
        if self.network == "host":
            port = _free_port()
            kwargs["environment"]["port"] = str(port)
        else:
            kwargs["ports"] = {f"{WATCHDOG_PORT}/tcp": ("127.0.0.1", None)}
        if self.memory_bytes:
            kwargs["mem_limit"] = self.memory_bytes
        if self.cpus:
            kwargs["nano_cpus"] = int(self.cpus * 1e9)
        secrets = given_secrets()
        if secrets:   # in memory only (a tmpfs volume: an archive reaches a volume, not a tmpfs mount)
            self._secrets_volume = self._client.volumes.create(
                name=f"{name}-secrets", labels=labels, driver="local",
                driver_opts={"type": "tmpfs", "device": "tmpfs", "o": "size=1m,mode=0755"})
            kwargs["volumes"] = {self._secrets_volume.name: {"bind": SECRETS_DIR, "mode": "rw"}}
        started = time.monotonic()
        self._container = self._client.containers.run(self.image, **kwargs)
        if secrets:   # before its first call: the watchdog reads them at call time, as OpenFaaS's do
            self._container.put_archive(SECRETS_DIR, _secrets_archive(secrets))
        if not self._closing_registered:
            atexit.register(self.close)
            self._closing_registered = True
        if self.network != "host":
            self._container.reload()
            port = int(self._container.ports[f"{WATCHDOG_PORT}/tcp"][0]["HostPort"])
        self._url = f"http://127.0.0.1:{port}/"
        self._wait_healthy(started)
        log.info("function %s: container %s of %s ready in %.2f s", self.name, name, self.image,
                 time.monotonic() - started)

    def _wait_healthy(self, started: float) -> None:
        health = self._url.rstrip("/") + HEALTH_PATH
        while True:
            try:
                with urllib.request.urlopen(health, timeout=1.0) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            self._container.reload()
            if self._container.status not in ("created", "running"):
                logs = self._container.logs(tail=20).decode(errors="replace")
                self.close()
                raise RuntimeError(f"function container of {self.image} exited while starting:\n{logs}")
            if time.monotonic() - started > self.start_timeout_s:
                self.close()
                raise RuntimeError(f"function container of {self.image} not healthy within {self.start_timeout_s:g} s")
            time.sleep(0.05)

    def close(self) -> None:
        """Remove this worker's container (at exit, or when it died), and its secrets' volume."""
        container, self._container = self._container, None
        volume, self._secrets_volume = self._secrets_volume, None
        for thing in (container, volume):
            if thing is None:
                continue
            try:
                thing.remove(force=True)
            except Exception as exc:  # gone already: nothing to clean
                log.debug("removing %s: %s", getattr(thing, "name", "?"), exc)
