"""The ``p2pfaas`` command line: one app, the commands of the cli_* modules mounted on it, and the
one-line summaries ``--help`` lists."""

from __future__ import annotations

import typer

from p2pfaas import (cli_auth, cli_calls, cli_deadletters, cli_edge, cli_functions, cli_images, cli_scaling,
                     cli_secrets, cli_stack)
from p2pfaas.cli_common import command_group

app = command_group("p2pfaas: peer-to-peer Function-as-a-Service over NATS/JetStream and MQTT.")
TURNED_AWAY_GIVE_UP_S = 1.0   # run by hand: a broker that refuses the first connect is asked for this long


def _print_version(wanted: bool) -> None:
    if wanted:
        from broker.answers import VERSION

        typer.echo(f"p2pfaas {VERSION}")
        raise typer.Exit()


@app.callback()
def _run_by_hand(ctx: typer.Context,
                 version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                              help="Print the version and exit.")) -> None:
    # A command run by hand says at once that nothing listens at its NATS URL (nats-py retried for
    # 10 s); a part `up` started keeps retrying to its deadline, as its broker may be restarting.
    from broker import connection
    from broker.lifecycle import parent_pipe_watched

    if parent_pipe_watched():
        return
    before = connection.GIVE_UP_TURNED_AWAY_S
    connection.GIVE_UP_TURNED_AWAY_S = TURNED_AWAY_GIVE_UP_S
    ctx.call_on_close(lambda: setattr(connection, "GIVE_UP_TURNED_AWAY_S", before))   # a CliRunner's process


# every command and group, in the order `--help` lists them
app.add_typer(cli_scaling.eval_app, name="eval")
for command in (cli_stack.up, cli_stack.node, cli_stack.bridge, cli_calls.invoke, cli_stack.learner):
    app.command()(command)
app.add_typer(cli_auth.app, name="auth")
app.add_typer(cli_scaling.train_app, name="train")
app.add_typer(cli_scaling.farm_app, name="farm")
cli_scaling.mount_scaling_commands()
app.command("controller")(cli_scaling.controller_cmd)
app.command()(cli_calls.top)
app.add_typer(cli_images.app, name="image")
app.command("hub")(cli_edge.hub)
app.command("join")(cli_edge.join)
cli_auth.app.command("invite")(cli_edge.auth_invite)
cli_auth.app.command("revoke")(cli_edge.auth_revoke)
compose_app = command_group("compose.yaml's deployment: its identities.")
compose_app.command("init")(cli_edge.compose_init)
app.add_typer(compose_app, name="compose")
app.add_typer(cli_deadletters.app, name="dead-letters")
app.add_typer(cli_secrets.app, name="secret")
for name, command in (("deploy", cli_functions.deploy), ("list", cli_functions.list_functions),
                      ("describe", cli_functions.describe), ("remove", cli_functions.remove),
                      ("logs", cli_functions.logs)):
    app.command(name)(command)


# What `--help` lists for each command and group: whole in 80 columns (click cuts a longer first
# sentence with "..."); the docstrings say the rest. A command without one fails tests/p2pfaas/test_help.py.
SUMMARIES = {
    "up": "Start the whole stack: broker, nodes, controller.",
    "node": "Run one node against a running NATS.",
    "bridge": "Run one bridge (HTTP, MQTT) against a running NATS.",
    "invoke": "Invoke a function and print its output.",
    "learner": "Run the learner of one or more nodes.",
    "controller": "Scale a pool live with a policy.",
    "top": "Live view of nodes, pools and who scales them.",
    "hub": "Run a hub that devices join as leaf nodes.",
    "join": "Start this machine as a device of a hub.",
    "eval": "Experiments against references.",
    "eval p2p": "P2P scheduling vs the Erlang-B bounds.",
    "eval learning": "LearningScheduler vs NoScheduler and PowerOfN.",
    "eval scaling": "Every scaling policy on the same seeded episodes.",
    "eval trace-sample": "Write a generated day in the Azure 2019 trace format.",
    "auth": "Identities of a stack and of a hub.",
    "auth device": "Create (or show) a device identity.",
    "auth operator": "Print the operator token.",
    "auth invite": "Invite a device machine to the hub.",
    "auth revoke": "Remove a device machine from the hub.",
    "train": "Train models.",
    "train scaling": "Train an RL scaling agent on the simulated farm.",
    "train scheduling": "Train the LearningScheduler's table.",
    "farm": "Run a scenario's tasks live.",
    "farm run": "Emit a scenario's tasks into a node; report QoS.",
    "image": "Container images built from this repository.",
    "image build": "Build an image on the Docker engine.",
    "compose": "compose.yaml's deployment.",
    "compose init": "Make the identities of compose.yaml's services.",
    "deploy": "Deploy a function on every node (or a stack file's).",
    "list": "The deployment's functions.",
    "describe": "One function: reference, environment, labels.",
    "remove": "Remove a function from every node.",
    "logs": "What a function printed, on every node.",
    "dead-letters": "List, show and redrive dead-lettered tasks.",
    "dead-letters list": "The dead letters, oldest first.",
    "dead-letters show": "One dead letter, its headers and payload.",
    "dead-letters redrive": "Store dead letters again in a node's intake.",
    "secret": "The deployment's secrets (sealed; names only shown).",
    "secret create": "Create a secret.",
    "secret update": "Change a secret's value.",
    "secret list": "The secrets' names.",
    "secret remove": "Remove a secret no function uses.",
}


def _summarise(group: typer.Typer, path: tuple[str, ...] = ()) -> None:
    for command in group.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        command.short_help = SUMMARIES.get(" ".join((*path, name)), command.short_help)
    for sub in group.registered_groups:
        sub.short_help = SUMMARIES.get(" ".join((*path, sub.name)), sub.short_help)
        _summarise(sub.typer_instance, (*path, sub.name))


_summarise(app)


if __name__ == "__main__":
    app()
