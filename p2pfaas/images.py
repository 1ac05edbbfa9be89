"""Container images built from this repository: worker and node (Dockerfile), the example function,
and a registry-free Debian base (debootstrap). The build context is assembled here: sources only,
plus this machine's pip CA bundle and torch wheel, never written into the repository. Images are
tagged ``latest`` and by the hash of their sources."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import docker
from docker.errors import ImageNotFound

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("broker", "nodes", "controller", "functions", "p2pfaas")
SOURCE_FILES = ("Dockerfile", "pyproject.toml", "README.md", "mosquitto.conf", "nats.conf",
                "docker/env.sh", "docker/worker-requirements.txt", "docker/wheels/README.md")
TARGETS = {"worker": "p2pfaas-worker", "node": "p2pfaas"}
EXAMPLE_FUNCTION = "wordcount"
DEFAULT_BASE = "python:3.11-slim"
TORCH_WHEEL = re.compile(r"^torch-2\.13\.0\+cpu-.*\.whl$")
Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """The engine refused the build; the message ends with the build's last lines."""


@dataclass
class BuildOptions:
    base: str = DEFAULT_BASE
    ca_bundle: Path | None = None       # copied in as the CA pip trusts (None: none)
    wheels: list[Path] = field(default_factory=list)  # local wheels offered to pip (node image: torch)


def repository_root() -> Path:
    """The source checkout images are built from; ValueError for an installed copy."""
    if not (ROOT / "Dockerfile").is_file():
        raise ValueError(f"no Dockerfile under {ROOT}: images are built from a source checkout of p2pfaas")
    return ROOT


def _source_paths(root: Path, dirs: Iterable[str], files: Iterable[str]) -> list[Path]:
    paths = [root / f for f in files]
    for d in dirs:
        paths += sorted(p for p in (root / d).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pt"))
    return paths


def sources_digest(paths: Iterable[Path], root: Path, extra: str = "") -> str:
    """Hash of file names and contents (and ``extra``): the content tag of an image."""
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _context_tar(root: Path, paths: list[Path], extras: dict[str, Path]) -> io.BufferedRandom:
    """A tar of ``paths`` (relative to ``root``) plus ``extras`` (name in context -> file)."""
    fileobj = tempfile.TemporaryFile()
    with tarfile.open(fileobj=fileobj, mode="w") as tar:
        for path in paths:
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
        for arcname, path in extras.items():
            tar.add(path, arcname=arcname, recursive=False)
    fileobj.seek(0)
    return fileobj


def _stream_build(client: docker.DockerClient, progress: Progress | None, **kwargs) -> str:
    """Run a build through the low-level API, reporting each output line; the image id."""
    tail: list[str] = []
    image_id = ""
    for chunk in client.api.build(decode=True, rm=True, forcerm=True, network_mode="host", **kwargs):
        if "error" in chunk:
            raise ImageBuildError(f"{chunk['error'].strip()}\n" + "\n".join(tail[-20:]))
        line = chunk.get("stream", "").rstrip()
        if line:
            tail.append(line)
            if progress:
                progress(line)
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
    if not image_id:
        raise ImageBuildError("the engine reported no image id\n" + "\n".join(tail[-20:]))
    return image_id


def image_tags(target: str, options: BuildOptions, root: Path | None = None) -> tuple[str, str]:
    """(``name:latest``, ``name:<content hash>``) of a target of the Dockerfile."""
    root = root or repository_root()
    name = TARGETS[target]
    digest = sources_digest(_source_paths(root, SOURCE_DIRS, SOURCE_FILES), root,
                            extra=f"{target}|{options.base}|{[w.name for w in options.wheels]}")
    return f"{name}:latest", f"{name}:{digest}"


def build_image(client: docker.DockerClient, target: str = "worker", options: BuildOptions | None = None,
                progress: Progress | None = None) -> str:
    """Build ``worker`` or ``node`` from the Dockerfile; returns the content-tagged reference."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    options = options or BuildOptions()
    root = repository_root()
    latest, tagged = image_tags(target, options, root)
    extras: dict[str, Path] = {}
    if options.ca_bundle is not None:
        extras["docker/ca.crt"] = options.ca_bundle
    if target == "node":
        extras.update({f"docker/wheels/{w.name}": w for w in options.wheels})
    paths = _source_paths(root, SOURCE_DIRS, SOURCE_FILES)
    with _context_tar(root, paths, extras) as context:
        image_id = _stream_build(client, progress, fileobj=context, custom_context=True, tag=tagged,
                                 target=target, buildargs={"BASE": options.base})
    client.images.get(image_id).tag(latest)
    return tagged


def _on_engine(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except ImageNotFound:
        return False


def ensure_image(client: docker.DockerClient, target: str = "worker", options: BuildOptions | None = None,
                 progress: Progress | None = None) -> str:
    """The content-tagged image of the current sources, built only when the engine lacks it."""
    options = options or BuildOptions()
    _, tagged = image_tags(target, options)
    return tagged if _on_engine(client, tagged) else build_image(client, target, options, progress)


def build_function_image(client: docker.DockerClient, name: str = EXAMPLE_FUNCTION, base: str = DEFAULT_BASE,
                         progress: Progress | None = None) -> str:
    """The example function image (functions/images/<name>/: a handler behind functions/watchdog.py)."""
    root = repository_root()
    folder = root / "functions" / "images" / name
    if not (folder / "Dockerfile").is_file():
        raise ValueError(f"no function image {name!r} under {folder}")
    paths = [root / "functions" / "watchdog.py", *_source_paths(root, [f"functions/images/{name}"], [])]
    tag = f"p2pfaas-fn-{name}:{sources_digest(paths, root, extra=base)}"
    if _on_engine(client, tag):
        return tag
    with _context_tar(root, paths, {}) as context:
        image_id = _stream_build(client, progress, fileobj=context, custom_context=True, tag=tag,
                                 dockerfile=f"functions/images/{name}/Dockerfile", buildargs={"BASE": base})
    client.images.get(image_id).tag(f"p2pfaas-fn-{name}:latest")
    return tag


# -- what this machine's pip relies on ---------------------------------------------
def pip_ca_bundle() -> Path | None:
    """The CA bundle pip is told to trust here (PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE)."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    return None


def pip_find_links() -> list[Path]:
    """Local directories pip's configuration offers wheels from (find-links)."""
    found = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
    try:
        listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                 text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        listing = ""
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            found += value.strip().strip("'\"").split()
    dirs = [Path(p.removeprefix("file://")) for p in found if "://" not in p or p.startswith("file://")]
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


def local_torch_wheel() -> Path | None:
    """torch 2.13.0's CPU wheel where pip finds local wheels, if this machine has one."""
    for folder in pip_find_links():
        for wheel in sorted(folder.glob("torch-2.13.0*.whl")):
            if TORCH_WHEEL.match(wheel.name):
                return wheel
    return None


# -- a base image without a registry ------------------------------------------------
DEBOOTSTRAP_TIMEOUT_S = 1200.0   # seen here: 1-2 min; on a busy machine with a slow mirror, longer


def debootstrap_rootfs(cache_dir: Path, suite: str = "bookworm", progress: Progress | None = None,
                       timeout_s: float = DEBOOTSTRAP_TIMEOUT_S) -> Path:
    """A tar of a minimal Debian ``suite`` with python3 and venv, made once and cached."""
    tarball = rootfs_tarball(cache_dir, suite)
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install -y debootstrap)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        rootfs = Path(tmp) / "rootfs"
        if progress:
            progress(f"debootstrap {suite} (python3, python3-venv) into {rootfs} ...")
        _debootstrap(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                      suite, str(rootfs)], rootfs, timeout_s)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)  # atomic: a concurrent or interrupted run never sees half a tar
    return tarball


def rootfs_tarball(cache_dir: Path, suite: str = "bookworm") -> Path:
    """Where ``debootstrap_rootfs`` caches ``suite``'s tar."""
    return cache_dir / f"rootfs-{suite}-python3.tar"


def _debootstrap(command: list[str], rootfs: Path, timeout_s: float) -> None:
    """Run ``command``; whatever ends it (a failure, its bound, an interrupt such as a test's
    timeout) ends debootstrap too and unmounts what it mounted inside ``rootfs`` (its /proc):
    the temporary directory can then be removed, and no debootstrap goes on writing into it."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"debootstrap took longer than {timeout_s:.0f} s (a slow mirror?); "
                           f"stopped it, nothing was cached") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
        unmount_below(rootfs)
    if process.returncode != 0:
        raise RuntimeError(f"debootstrap failed ({process.returncode}): {output[-2000:]}")


def unmount_below(root: Path) -> None:
    """Unmount every mount point below ``root`` (not ``root`` itself), deepest first."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        points = [line.split()[1].replace("\\040", " ") for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        done = subprocess.run(["umount", "-l", point], capture_output=True, text=True)
        if done.returncode != 0:
            log.warning("could not unmount %s: %s", point, done.stderr.strip())


def import_base_image(client: docker.DockerClient, name: str, cache_dir: Path, progress: Progress | None = None) -> str:
    """``name`` on the engine, imported from the cached debootstrap tar when missing."""
    if _on_engine(client, name):
        return name
    tarball = debootstrap_rootfs(cache_dir, progress=progress)
    repository, _, tag = name.partition(":")
    # from the file (sent with its length): the SDK's chunked stream upload is refused by dockerd 20.10
    client.api.import_image_from_file(str(tarball), repository=repository, tag=tag or "latest",
                                      changes=['CMD ["python3"]'])
    return name
