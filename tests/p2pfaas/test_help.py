"""Every command's ``--help`` reads whole at 80 columns: no line wider, no name cut with an
ellipsis, every flag spelled out (typer's boxed help cut ``--heartbeat-per…`` and showed every
flag as taking a ``<bool>``)."""

from __future__ import annotations

import re

import typer.main
from typer.testing import CliRunner

from p2pfaas.cli import app

WIDTH = 80


def commands(group, path: tuple[str, ...] = ()):
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from commands(command, (*path, name))


def test_every_help_reads_whole_at_80_columns():
    root = typer.main.get_command(app)
    runner = CliRunner()
    seen = 0
    for path, command in commands(root):
        done = runner.invoke(app, [*path, "--help"], terminal_width=WIDTH, env={"COLUMNS": str(WIDTH)},
                             prog_name="p2pfaas")
        where = " ".join(("p2pfaas", *path, "--help"))
        assert done.exit_code == 0, (where, done.output)
        lines = done.output.splitlines()
        assert lines and lines[0].startswith("Usage: "), (where, done.output)
        wide = [line for line in lines if len(line) > WIDTH]
        assert not wide, (where, wide)
        assert "…" not in done.output, (where, done.output)
        assert "<bool>" not in done.output, (where, done.output)
        spelled = set(re.findall(r"(?<![\w-])-{1,2}[A-Za-z0-9][\w-]*", done.output))
        for param in command.params:
            for flag in (*param.opts, *param.secondary_opts):
                if flag.startswith("-"):
                    assert flag in spelled, (where, flag, done.output)
        for name in getattr(command, "commands", {}):   # listed with its summary whole (click cuts with "...")
            listed = [line for line in lines if line.split()[:1] == [name]]
            assert listed and not listed[0].rstrip().endswith("..."), (where, name, done.output)
        seen += 1
    assert seen >= 25, seen   # every group and command was walked


def test_every_command_has_a_summary():
    from p2pfaas.cli import SUMMARIES

    root = typer.main.get_command(app)
    names = {" ".join(path) for path, _ in commands(root) if path}
    assert names == set(SUMMARIES), names ^ set(SUMMARIES)


def test_version_is_the_one_the_package_declares():
    """One version string in the code (broker.answers.VERSION: the CLI, /info, heartbeats and the
    scheduler API say it), the same as the package's metadata from pyproject.toml."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"]
    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0, done.output
    assert done.output == f"p2pfaas {declared}\n"
    assert version("p2pfaas") == declared
