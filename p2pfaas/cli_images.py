"""``p2pfaas image build``: container images built from this repository (docs/containers.md)."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from p2pfaas.cli_common import (command_group, console)

app = command_group("Container images built from this repository (docs/containers.md).")


class ImageTarget(str, Enum):
    worker = "worker"
    node = "node"
    function = "function"

@app.command("build")
def image_build(
    target: ImageTarget = typer.Option(ImageTarget.worker, help="worker: `--runtime docker` workers (small, no torch); node: every role (compose); function: the example function image (wordcount)."),
    base: str = typer.Option("python:3.11-slim", help="Base image (python3 3.11+ with venv), e.g. a local Debian image when no registry is reachable."),
    ca_bundle: Optional[Path] = typer.Option(None, help="CA bundle pip trusts inside the build (default: PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE when set)."),
    torch_wheel: Optional[Path] = typer.Option(None, help="torch 2.13.0 CPU wheel for the node image (default: one in pip's find-links, else PyTorch's CPU index)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every build line."),
) -> None:
    """Build an image on the Docker engine DOCKER_HOST names; prints its reference (also tagged :latest)."""
    import docker
    from docker.errors import DockerException

    from p2pfaas import images

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except DockerException as exc:
        console.print(f"[red]error:[/] no Docker engine at {os.environ.get('DOCKER_HOST', 'the default socket')}: {exc}")
        raise typer.Exit(2)
    for path, flag in ((ca_bundle, "--ca-bundle"), (torch_wheel, "--torch-wheel")):
        if path is not None and not path.is_file():
            raise typer.BadParameter(f"{path} is not a file", param_hint=flag)
    options = images.BuildOptions(base=base, ca_bundle=ca_bundle or images.pip_ca_bundle())
    if target is ImageTarget.node:
        wheel = torch_wheel or images.local_torch_wheel()
        options.wheels = [wheel] if wheel else []
        console.print(f"torch: {wheel or 'from PyTorch CPU index (no local wheel found)'}")
    with console.status(f"building {target.value} image on {base} ...") as status:
        def progress(line: str) -> None:
            if verbose:
                console.print(line, markup=False, highlight=False)
            elif line.startswith("Step "):
                status.update(f"building {target.value} image: {line[:100]}")
        try:
            if target is ImageTarget.function:
                ref = images.build_function_image(client, base=base, progress=progress)
            else:
                ref = images.build_image(client, target.value, options, progress=progress)
        except (images.ImageBuildError, ValueError, DockerException) as exc:
            console.print(f"[red]build failed:[/] {exc}")
            raise typer.Exit(1)
    console.print(f"[green]built[/] {ref}")
    print(ref)
