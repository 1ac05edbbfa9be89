"""Docker fixtures: one engine per test session (DOCKER_HOST's, or a private dockerd), a base
image made once per machine (debootstrap, cached), and the images built from this checkout."""

from __future__ import annotations

import logging
import re
import shutil
from typing import Iterator

import docker
import pytest
from docker_engine import EngineUnavailable, cache_dir, docker_engine

from p2pfaas import images

log = logging.getLogger(__name__)

BASE_IMAGE = "p2pfaas-base:bookworm"
TEST_PREFIX = re.compile(r"^t[0-9a-f]{10}$")   # the `prefix` fixture's shape
# The first docker test on a machine makes the base image (debootstrap: its own bound, 20 min);
# the suite's 120 s per test would cut it off, and every later test would start it again.
FIRST_BUILD_TIMEOUT_S = images.DEBOOTSTRAP_TIMEOUT_S + 300
_base_failure: list[str] = []   # why the base image could not be made: later tests fail at once


def pytest_collection_modifyitems(config, items):
    first_build = not images.rootfs_tarball(cache_dir()).is_file()
    for item in items:
        if "tests/docker/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.docker)
            if first_build:
                item.add_marker(pytest.mark.timeout(FIRST_BUILD_TIMEOUT_S), append=False)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """The session's engine; the whole docker suite skips (saying why) only when none can be had."""
    engine = docker_engine()
    try:
        client, _host = engine.__enter__()
    except EngineUnavailable as exc:
        pytest.skip(f"no Docker engine: {exc}")
    try:
        yield client
    finally:
        _remove_test_containers(client)
        engine.__exit__(None, None, None)


def _remove_test_containers(client: docker.DockerClient) -> None:
    """Whatever a test left behind, by the test prefixes' labels (nobody else's)."""
    for container in client.containers.list(all=True, filters={"label": "p2pfaas.prefix"}):
        if TEST_PREFIX.match(container.labels.get("p2pfaas.prefix", "")):
            container.remove(force=True)


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """A Debian bookworm image with python3 + venv, from debootstrap (about a minute, once per machine)."""
    if _base_failure:
        pytest.fail(f"no base image (an earlier test tried): {_base_failure[0]}")
    if shutil.which("debootstrap") is None and not images.rootfs_tarball(cache_dir()).exists():
        pytest.fail("debootstrap is not installed: apt-get install -y debootstrap (.ci/run does this)")
    try:
        return images.import_base_image(docker_client, BASE_IMAGE, cache_dir(), progress=log.info)
    except BaseException as exc:   # pytest-timeout's Failed too: the next tests must not start it again
        _base_failure.append(f"{type(exc).__name__}: {exc}"[:500])
        raise


@pytest.fixture(scope="session")
def build_options(base_image) -> images.BuildOptions:
    return images.BuildOptions(base=base_image, ca_bundle=images.pip_ca_bundle())


@pytest.fixture(scope="session")
def worker_image(docker_client, build_options) -> str:
    """The worker image of the current sources (rebuilt only when they changed)."""
    tag = images.ensure_image(docker_client, "worker", build_options, progress=log.info)
    _drop_older_tags(docker_client, tag)
    return tag


@pytest.fixture(scope="session")
def function_image(docker_client, base_image) -> str:
    """The example function image (wordcount)."""
    return images.build_function_image(docker_client, base=base_image, progress=log.info)


def _drop_older_tags(client: docker.DockerClient, keep: str) -> None:
    """Earlier content tags of the same image (older checkouts): the cache must not grow forever."""
    repository = keep.partition(":")[0]
    for image in client.images.list(name=repository):
        tags = [t for t in image.tags if t != keep and not t.endswith(":latest")]
        if tags and keep not in image.tags:
            for tag in tags:
                try:
                    client.images.remove(tag)
                except docker.errors.APIError:  # in use by a container: next time
                    pass
