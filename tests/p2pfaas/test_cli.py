"""``p2pfaas up`` and ``p2pfaas invoke`` as a user runs them: real processes, real brokers."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
import typer

from broker.auth import OPERATOR, AuthStore
from broker.permissions import nats_accounts
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer, free_port
from broker.handoff import HANDOFF_FD_ENV, SECRET_NAMES
from broker.lifecycle import PARENT_PIPE_ENV
from broker.subjects import SCHEDULING_MODEL, Subjects
from p2pfaas.cli import app
from p2pfaas.parts import HttpBridgeSettings

from stack_processes import P2PFAAS, alive, descendants, wait_endpoints


def invoke(data_dir: Path, via: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*P2PFAAS, "invoke", "fib", "--data", "25", "--via", via, "--data-dir", str(data_dir), *extra],
                          capture_output=True, text=True, timeout=60)


def stop_and_check_no_orphans(proc: subprocess.Popen) -> str:
    children = descendants(proc.pid)
    assert children, "up should have started nats-server and workers"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    deadline = time.monotonic() + 10
    while any(alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if alive(c)], "orphan processes left behind"
    return out


@pytest.mark.parametrize("mqtt", ["nats", "mosquitto"])
def test_up_serves_http_nats_mqtt_and_stops_cleanly(tmp_path, mqtt, start_up):
    if mqtt == "mosquitto" and not (Path("/usr/sbin/mosquitto").exists()):
        pytest.fail("mosquitto not installed (.ci/run installs it)")
    busy_port = 18080   # the default, taken: replaced by a free one and said (one given on purpose is refused)
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", busy_port))
        busy.listen()
    except OSError:   # taken already
        pass
    try:
        proc = start_up(tmp_path, "--nats-port", str(free_port()), "--mqtt-port", str(free_port()), "--mqtt", mqtt)
        endpoints = wait_endpoints(proc, tmp_path)
        http = endpoints["http"]["n1"]
        assert not http.endswith(f":{busy_port}")
        r = httpx.post(f"{http}/function/fib", content=b"25", timeout=30)
        assert r.status_code == 200 and r.text == "75025" and r.headers["X-P2pfaas-Scheduler"]
        for via in ("http", "nats", "mqtt"):
            done = invoke(tmp_path, via)
            assert done.returncode == 0 and done.stdout.strip() == "75025", (via, done.stdout, done.stderr)
        bad = subprocess.run([*P2PFAAS, "invoke", "nope", "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "unknown function" in bad.stdout
        assert_workers_hold_no_bridge_secrets(tmp_path / "nodes" / "n1" / "run" / "workers")
        out = stop_and_check_no_orphans(proc)
    finally:
        busy.close()
    assert f"port {busy_port} is busy" in out
    # nats-server's log is where `up` says the logs are (it was in DATA_DIR/nats, and logs/ had an empty file)
    assert "Server is ready" in (tmp_path / "logs" / "nats-server.log").read_text()
    assert not (tmp_path / "nats" / "nats-server.log").exists()
    assert "p2pfaas is up" in out and "stopped" in out
    assert not (tmp_path / "endpoints.json").exists()


def assert_workers_hold_no_bridge_secrets(pid_dir: Path) -> None:
    """The node serves its HTTP bridge from its own process; the worker processes it starts run
    user code and get no secret in their environment: not the bridge's tokens or NATS password,
    not even their own identity, which is handed over (broker.handoff)."""
    pids = [int(f.read_text().split()[0]) for f in pid_dir.glob("*.pid")]
    assert pids, f"no worker pid files in {pid_dir}"
    for pid in pids:
        names = {entry.split(b"=", 1)[0] for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")}
        assert b"P2PFAAS_WORKER_NAME" in names and HANDOFF_FD_ENV.encode() in names   # the check reads the right processes
        leaked = names & {*(n.encode() for n in SECRET_NAMES), b"P2PFAAS_TLS_KEY"}
        assert not leaked, f"worker {pid} got {sorted(leaked)} in its environment"


def test_up_verbose_starts_every_part_and_stops_cleanly(tmp_path, start_up):
    """`up -v` passes --verbose to every part it starts: the controller had no such option, so the
    stack never came up."""
    proc = start_up(tmp_path, "-v", "--nats-port", str(free_port()), "--http-port", str(free_port()), "--mqtt", "off")
    endpoints = wait_endpoints(proc, tmp_path, timeout_s=120)
    health = httpx.get(f"{endpoints['http']['n1']}/healthz", timeout=10)
    assert health.status_code == 200, health.text
    unknown = invoke(tmp_path, "http", "--node", "n9")   # not n1's answer, as it was
    assert_one_clear_line(unknown, "no HTTP endpoint for node n9 in ")
    assert "(known: n1)" in unknown.stderr and not unknown.stdout
    out = stop_and_check_no_orphans(proc)
    assert "p2pfaas is up" in out and "stopped" in out and "Traceback" not in out
    assert " INFO " in (tmp_path / "logs" / "controller.log").read_text()   # it did log at INFO


def test_up_with_more_http_processes_serves_the_port_from_all_of_them(tmp_path, start_up):
    """`up --http-processes 2`: the node's process serves its HTTP port and starts one more bridge
    process on it (SO_REUSEPORT), which is handed the bridge's identity, not the node's nor its
    workers', and gets no secret in its environment; calls on new connections are answered
    whichever process takes them."""
    proc = start_up(tmp_path, "--nodes", "1", "--http-processes", "2", "--nats-port", str(free_port()),
                    "--http-port", str(free_port()), "--mqtt", "off", "--controller", "off")
    endpoints = wait_endpoints(proc, tmp_path, timeout_s=120)
    port = endpoints["http"]["n1"].rsplit(":", 1)[1]
    node = int((tmp_path / "run" / "node-n1.pid").read_text().split()[0])
    siblings = [pid for pid in descendants(node)
                if b"\0bridge\0http\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
                and f"\0--port\0{port}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(siblings) == 1, siblings
    environ = dict(entry.split(b"=", 1) for entry in Path(f"/proc/{siblings[0]}/environ").read_bytes().split(b"\0") if b"=" in entry)
    assert HANDOFF_FD_ENV.encode() in environ and not {n.encode() for n in SECRET_NAMES} & environ.keys(), list(environ)
    store = AuthStore(tmp_path / "auth")
    bridge, worker = store.service("bridge"), store.worker("n1")
    handed = HttpBridgeSettings(node="n1", nats_url="", operator_token="t", nats_credentials=(bridge.user, bridge.password))
    assert handed.sibling_secrets() == {"P2PFAAS_OPERATOR_TOKEN": "t", "P2PFAAS_NATS_USER": bridge.user,
                                        "P2PFAAS_NATS_PASSWORD": bridge.password}
    assert worker.password.encode() not in b"".join(environ.values())
    for _ in range(12):   # a new connection each: the kernel spreads them over both processes
        r = httpx.post(f"{endpoints['http']['n1']}/function/fib", content=b"20", timeout=30)
        assert r.status_code == 200 and r.text == "6765", r.text
    out = stop_and_check_no_orphans(proc)
    assert "Traceback" not in out


def test_every_part_command_takes_verbose():
    """The commands `up` runs as parts (Stack._cli: node, bridge http/mqtt, controller) all take
    --verbose, which `up -v` appends to each."""
    group = typer.main.get_command(app)
    for name in ("node", "bridge", "controller"):
        assert "--verbose" in {o for p in group.commands[name].params for o in p.opts}, name


def test_invoke_reports_unreachable_broker_clearly(tmp_path):
    port = free_port()
    done = subprocess.run([*P2PFAAS, "invoke", "fib", "--data", "1", "--via", "nats", "--nats-url",
                           f"nats://127.0.0.1:{port}", "--data-dir", str(tmp_path), "--timeout", "3"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot connect to NATS" in done.stderr


def test_help_lists_commands():
    out = subprocess.run([*P2PFAAS, "--help"], capture_output=True, text=True, timeout=60).stdout
    for command in ("up", "node", "bridge", "invoke"):
        assert command in out


def run_all(commands: list[list[str]], timeout_s: float = 90) -> list[subprocess.CompletedProcess]:
    """Run the CLI commands side by side (most wait on a broker that is not there), each bounded."""
    env = {**os.environ, "COLUMNS": "400"}   # one error line stays one line
    procs = [subprocess.Popen([*P2PFAAS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for args in commands]
    done = []
    try:
        for args, proc in zip(commands, procs):
            out, err = proc.communicate(timeout=timeout_s)
            done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
    return done


def assert_one_clear_line(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.args, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], (done.args, done.stderr)


def test_an_unreachable_broker_is_one_clear_line(tmp_path):
    url = f"nats://127.0.0.1:{free_port()}"   # nobody listens there
    stack = ["--nats-url", url, "--data-dir", str(tmp_path)]
    commands = [["top", "--once", "1", *stack], ["top", *stack], ["farm", "run", *stack], ["controller", *stack],
                ["bridge", "http", "--port", str(free_port()), "--nats-url", url], ["bridge", "mqtt", "--nats-url", url],
                ["node", "--data-dir", str(tmp_path), "--nats-url", url],
                ["eval", "p2p", "--duration", "1", "--nats-url", url],
                ["invoke", "fib", "--via", "nats", *stack], ["learner", *stack]]
    for done in run_all(commands):
        assert_one_clear_line(done, f"cannot connect to NATS at {url}: ")
        assert "p2pfaas up" in done.stderr or "check --nats-url" in done.stderr, done.stderr


def by_hand_env() -> dict[str, str]:
    """A user's shell: no identity or parent pipe of a part `up` started (one error line stays one line)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("P2PFAAS_")}, "COLUMNS": "400"}


def test_an_unreachable_broker_is_said_at_once(tmp_path):
    """A command run by hand against a port where nothing listens (a wrong --nats-url, the URL a
    killed stack left in its data dir) said so after 10 s: nats-py retried the refused connect
    until connect()'s deadline. Now after about a second (the bound leaves room for a loaded machine)."""
    url = f"nats://127.0.0.1:{free_port()}"   # nobody listens there
    dead = tmp_path / "dead"   # as a killed `up` leaves it
    dead.mkdir()
    (dead / "endpoints.json").write_text(json.dumps({"nats_url": url, "mqtt_url": None, "prefix": "faas", "http": {}}))
    given = ["--nats-url", url, "--data-dir", str(tmp_path)]
    commands = [["top", "--once", "1", *given], ["invoke", "fib", "--via", "nats", *given], ["farm", "run", *given],
                ["top", "--once", "1", "--data-dir", str(dead)], ["bridge", "mqtt", "--data-dir", str(dead)]]
    for args in commands:   # one at a time: each is timed
        started = time.monotonic()
        done = subprocess.run([*P2PFAAS, *args], capture_output=True, text=True, timeout=60, env=by_hand_env())
        took = time.monotonic() - started
        assert_one_clear_line(done, f"cannot connect to NATS at {url}: ")
        assert took < 5.0, (args, f"{took:.1f} s")


async def test_a_refused_identity_is_said_at_once(tmp_path):
    """A broker that turns the identity away (no stack's identities in --data-dir, a stale
    password) was asked again for 10 s, as an unreachable one was."""
    store = AuthStore(tmp_path / "auth")
    store.service(OPERATOR)
    async with NatsServer(data_dir=tmp_path / "nats", port=None, mqtt_port=None,
                          accounts=nats_accounts(store, ["n1"])) as server:
        started = time.monotonic()
        done = await asyncio.to_thread(
            subprocess.run, [*P2PFAAS, "top", "--once", "1", "--nats-url", server.url, "--data-dir", str(tmp_path / "none")],
            capture_output=True, text=True, timeout=60, env=by_hand_env())
        took = time.monotonic() - started
    assert_one_clear_line(done, f"cannot connect to NATS at {server.url}: nats: 'Authorization Violation'")
    assert took < 5.0, f"{took:.1f} s"


async def test_a_slow_broker_is_waited_for(tmp_path, nats_server):
    """Only a refusal is given up on at once: a broker that takes seconds to answer CONNECT (a
    loaded machine's nats-server took 2-5 s per authenticated CONNECT) is waited for, as before."""
    slow_s = 3.0
    relays: list[asyncio.Task] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_answer_s: float) -> None:
        try:
            chunk = 0
            while data := await reader.read(65536):
                if chunk == 1:   # after INFO: the answer to CONNECT
                    await asyncio.sleep(delay_answer_s)
                writer.write(data)
                await writer.drain()
                chunk += 1
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", nats_server.port)
        relays.extend((asyncio.create_task(relay(reader, server_writer, 0.0)),
                       asyncio.create_task(relay(server_reader, writer, slow_s))))

    proxy = await asyncio.start_server(client, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    try:
        started = time.monotonic()
        done = await asyncio.to_thread(
            subprocess.run, [*P2PFAAS, "top", "--once", "1", "--nats-url", f"nats://127.0.0.1:{port}", "--data-dir",
                             str(tmp_path), "--prefix", "t" + uuid.uuid4().hex[:10]],
            capture_output=True, text=True, timeout=60, env=by_hand_env())
        took = time.monotonic() - started
    finally:
        proxy.close()
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
    assert done.returncode == 0 and "error" not in done.stderr, done.stderr
    assert took >= slow_s, f"{took:.1f} s: the broker's answer was not delayed"


def wait_ready(proc: subprocess.Popen, timeout_s: float) -> None:
    """Until the part prints READY on stdout (what `up` waits for); its stderr if it ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readable, _, _ = select.select([proc.stdout], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
        if readable:
            line = proc.stdout.readline()
            if line.strip() == "READY":
                return
            if not line and proc.poll() is not None:
                raise AssertionError(f"{proc.args[3:]} ended (code {proc.returncode}): {proc.stderr.read()}")
    raise AssertionError(f"{proc.args[3:]} not READY within {timeout_s:g} s")


def stop_parts(procs: list[subprocess.Popen]) -> list[str]:
    """SIGINT each part (Ctrl-C), its stderr; what does not stop within its bound is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    errors = []
    for proc in procs:
        try:
            errors.append(proc.communicate(timeout=60)[1])
        except subprocess.TimeoutExpired:
            proc.kill()
            errors.append(proc.communicate(timeout=10)[1])
    return errors


async def test_a_part_up_started_waits_for_its_broker(tmp_path):
    """Parts `up` starts (a parent pipe) keep retrying a refused first connect to its deadline, as
    before: their broker may be starting again after a crash. Only commands run by hand give up."""
    port = free_port()
    part = subprocess.Popen([*P2PFAAS, "bridge", "http", "--port", str(free_port()), "--nats-url", f"nats://127.0.0.1:{port}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**by_hand_env(), PARENT_PIPE_ENV: "1"})
    try:
        await asyncio.sleep(3.0)   # refused meanwhile: a command run by hand has given up by now
        async with NatsServer(data_dir=tmp_path / "nats", port=port, mqtt_port=None):
            await asyncio.to_thread(wait_ready, part, 30)
            stop_parts([part])
    finally:
        if part.poll() is None:
            part.kill()
            part.wait(timeout=10)


async def test_parts_run_by_hand_attach_to_the_running_stack(tmp_path):
    """`p2pfaas node`, `bridge` and `learner` without --nats-url attach to the stack `up` runs on
    --data-dir (as `top`, `invoke`, `farm run` and `controller` do), never to a shared broker of the
    machine: as its operator (a secure stack: its identities), and the hand-run HTTP bridge wants
    the stack's operator token as the stack's do. The test runs its own nats-server."""
    store = AuthStore(tmp_path / "auth")
    store.service(OPERATOR)   # as `up` leaves it
    prefix = "t" + uuid.uuid4().hex[:10]
    where = ["--data-dir", str(tmp_path), "--prefix", prefix]
    http_port = free_port()
    async with NatsServer(data_dir=tmp_path / "nats", port=None, mqtt_port=None,
                          accounts=nats_accounts(store, ["n1"])) as server:
        (tmp_path / "endpoints.json").write_text(json.dumps({"nats_url": server.url, "mqtt_url": None, "prefix": prefix,
                                                             "http": {}}))
        parts = [subprocess.Popen([*P2PFAAS, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=by_hand_env())
                 for args in (["node", "--runtime", "inprocess", *where],
                              ["bridge", "http", "--port", str(http_port), *where],
                              ["learner", "--node", "n9", *where])]
        operator = store.service(OPERATOR)
        nc = await connect(server.url, "test-operator", credentials=(operator.user, operator.password))
        try:
            for part in parts[:2]:
                await asyncio.to_thread(wait_ready, part, 90)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
                body = {"parallel_running_functions_max": 2}
                assert (await http.post("/configuration", json=body)).status_code == 401
                token = {"Authorization": f"Bearer {store.operator_token()}"}
                assert (await http.post("/configuration", json=body, headers=token)).status_code == 200   # n1 answered
            stats = Subjects(prefix).learner("n9", SCHEDULING_MODEL, "stats")
            deadline = time.monotonic() + 60
            while True:   # the learner prints no READY: it answers once it serves
                try:
                    await nc.request(stats, b"", timeout=1.0)
                    break
                except Exception:
                    assert time.monotonic() < deadline and parts[2].poll() is None, "the learner does not answer"
                    await asyncio.sleep(0.5)
        finally:
            await close_quietly(nc)
            errors = await asyncio.to_thread(stop_parts, parts)
    assert f"node n1 attached to {server.url}" in errors[0], errors[0]
    assert f"learner for n9 attached to {server.url}" in errors[2], errors[2]
    for args, err in zip(("node", "bridge", "learner"), errors):
        assert "Traceback" not in err and not [line for line in err.splitlines() if line.startswith("error:")], (args, err)


def test_without_a_running_stack_parts_ask_for_a_url(tmp_path):
    """As `top` and `invoke`: no `up` on --data-dir and no --nats-url is one line saying what to do."""
    where = ["--data-dir", str(tmp_path)]
    for done in run_all([["node", *where], ["bridge", "http", *where], ["bridge", "mqtt", *where], ["learner", *where]]):
        assert_one_clear_line(done, f"no running `p2pfaas up` found in {tmp_path} (no {tmp_path / 'endpoints.json'}): "
                                    "start one, or give --nats-url")
    assert not list(tmp_path.iterdir())


def test_bad_input_is_one_clear_line(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    cases = {
        ("farm", "run", "--scenario", "nope", "--data-dir", str(tmp_path)): "unknown scenario 'nope'; shipped: ",
        ("controller", "--scenario", "nope", "--data-dir", str(tmp_path)): "unknown scenario 'nope'; shipped: ",
        ("invoke", "fib", "--data", f"@{tmp_path / 'missing'}", "--data-dir", str(tmp_path)): "No such file",
        ("up", "-f", "nope", "--data-dir", str(tmp_path)): "function spec 'nope' must look like name=package.module:",
        ("up", "--data-dir", str(a_file)): f"--data-dir {a_file} is a file, not a directory",
        ("up", "--data-dir", str(a_file / "sub")): f"--data-dir {a_file / 'sub'} cannot be used",
        ("eval", "p2p", "--algorithm", "Bogus"): "unknown scheduler 'Bogus'; known: ",
        ("eval", "p2p", "--algorithm", "PowerOfNScheduler:x"): "PowerOfNScheduler takes ",
        # checked before anything starts (nats-server used to start, then the node's traceback)
        ("up", "--function", "x=nosuchmodule:f", "--data-dir", str(tmp_path)):
            "--function x=nosuchmodule:f: cannot import 'nosuchmodule' for 'nosuchmodule:f': No module named",
        ("up", "-f", "fib2=p2pfaas.cli:app,x=json:nosuch", "--data-dir", str(tmp_path)):
            "--function x=json:nosuch: 'json:nosuch' is not a callable",
        ("node", "-f", "x=nosuchmodule:f", "--data-dir", str(tmp_path)): "--function x=nosuchmodule:f: cannot import",
        # a policy name is checked at once, with the nearest names (it failed after 15 s)
        ("up", "--controller", "ppp", "--data-dir", str(tmp_path)):
            "--controller: unknown policy 'ppp': did you mean ppo? known: auto, dqn, pg (ppo), sarsa",
        ("up", "--controller", "fixed-0", "--data-dir", str(tmp_path)): "fixed-<n> takes a worker count of 1 or more",
        ("controller", "--policy", "kpaa", "--data-dir", str(tmp_path)):
            "--policy: unknown policy 'kpaa': did you mean kpa, hpa or keda?",
        ("controller", "--policy", str(tmp_path / "m.npz"), "--data-dir", str(tmp_path)):
            f"--policy: no model file {tmp_path / 'm.npz'}",
    }
    for done in run_all([list(args) for args in cases]):
        assert_one_clear_line(done, cases[tuple(done.args)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]   # nothing started, nothing written


async def test_a_broken_file_of_the_node_is_one_clear_line(tmp_path, nats_server, prefix):
    """A file cut by a crash mid-write made `p2pfaas node` end in a 139-line traceback (and its
    supervisor restart it for ever); functions.json and discovery.json were read as absent."""
    broken = {"configuration.json": b"", "scheduler.json": b'{"name": "PowerOfN',
              "functions.json": b'{"shout": "userfns:shout"}', "discovery.json": b'{"machine_group_name": '}
    commands = []
    for name, content in broken.items():
        data_dir = tmp_path / name
        (data_dir / "nodes" / "n1").mkdir(parents=True)
        (data_dir / "nodes" / "n1" / name).write_bytes(content)
        settings = data_dir / "settings.json"   # discovery.json is read once connected: a real broker
        settings.write_text(json.dumps({"node_id": "n1", "nats_url": nats_server.url, "prefix": prefix,
                                        "data_dir": str(data_dir), "learner": False, "runtime": "inprocess"}))
        commands.append(["node", "--settings", str(settings)])
    for (name, content), done in zip(broken.items(), await asyncio.to_thread(run_all, commands)):
        path = tmp_path / name / "nodes" / "n1" / name
        assert_one_clear_line(done, f"{path} is not valid (")
        assert "fix it, or delete it" in done.stderr and path.read_bytes() == content


def test_identities_are_given_only_for_a_stack_that_was_set_up(tmp_path):
    """`auth` on a data dir no `up` used would make credentials no running stack accepts."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    nothing = tmp_path / "nothing"
    missing = run_all([["auth", "operator", "--data-dir", str(nothing)], ["auth", "device", "dev1", "--data-dir", str(nothing)],
                       ["auth", "operator", "--data-dir", str(a_file)]])
    for done, where in zip(missing, (nothing, nothing, a_file)):
        assert_one_clear_line(done, f"no stack has been set up in {where} ")
        assert "run `p2pfaas up" in done.stderr and not done.stdout
    assert not nothing.exists()
    store = AuthStore(tmp_path / "stack" / "auth")
    store.service(OPERATOR)   # as `up` leaves it
    token, device = run_all([["auth", "operator", "--data-dir", str(tmp_path / "stack")],
                             ["auth", "device", "dev1", "--data-dir", str(tmp_path / "stack")]])
    assert token.returncode == 0 and token.stdout.strip() == store.operator_token()
    assert device.returncode == 0 and json.loads(device.stdout) == json.loads(store.device("dev1").as_json())


def test_out_of_range_numbers_of_up_are_usage_errors(tmp_path):
    """--k, --queue and the ports are checked by typer, as --nodes is (their range in --help):
    they were a pydantic ValidationError, or an OverflowError once nats-server had started."""
    cases = {
        ("--k", "0"): "Invalid value for '--k'", ("--k", "-2"): "Invalid value for '--k'",
        ("--queue", "-1"): "Invalid value for '--queue'", ("--http-port", "70000"): "Invalid value for '--http-port'",
        ("--nats-port", "-5"): "Invalid value for '--nats-port'", ("--mqtt-port", "65536"): "Invalid value for '--mqtt-port'",
        ("--http-port", "65535"): "65535 leaves no port for the last node (65537 > 65535): give at most 65533",
    }
    for done in run_all([["up", "--data-dir", str(tmp_path), *args] for args in cases]):
        assert done.returncode == 2 and "Traceback" not in done.stderr, (done.args, done.stderr)
        assert cases[tuple(done.args[3:])] in done.stderr, (done.args, done.stderr)
    assert not list(tmp_path.iterdir())   # nothing started, nothing written
    helped = subprocess.run([*P2PFAAS, "up", "--help"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "400"}).stdout
    assert "1<=x<=1024]" in helped and "0<=x<=65535]" in helped


def test_a_function_module_is_imported_as_a_node_would(tmp_path, monkeypatch):
    """The --function check imports in a child process from the current directory, as the node
    (`python -m`) does; a module that fails when imported is one line naming its error."""
    from p2pfaas.cli_common import _importable

    (tmp_path / "mine.py").write_text("def f(data):\n    return data\n")
    (tmp_path / "broken.py").write_text("import sys\nprint('hi')\nsys.stderr.write('partial')\nraise RuntimeError('boom')\n")
    monkeypatch.chdir(tmp_path)
    _importable([("mine", "mine:f"), ("dumps", "json:dumps")])
    done = subprocess.run([*P2PFAAS, "up", "-f", "b=broken:f", "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "400"})
    assert_one_clear_line(done, "--function b=broken:f: importing it raised RuntimeError: boom")
    assert not (tmp_path / "data").exists()


def test_an_image_function_without_an_engine_is_one_clear_line(tmp_path):
    """It started, listed the function as available, then answered every call 500 DockerException."""
    done = subprocess.run([*P2PFAAS, "up", "-f", "wc=image:p2pfaas-fn-wordcount", "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "400", "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert_one_clear_line(done, f"--function wc=image:p2pfaas-fn-wordcount: no Docker engine at unix://{tmp_path}"
                                "/no-engine.sock to run p2pfaas-fn-wordcount")
    assert "start one, or name it with DOCKER_HOST" in done.stderr
    assert not (tmp_path / "d").exists()


def test_a_busy_port_given_on_purpose_is_refused_and_a_busy_default_replaced(tmp_path):
    """An explicit --http-port that was busy was silently replaced by a free one."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {("--http-port", str(port - 1)): f"--http-port: node 2's port {port} is busy on 127.0.0.1: give "
                                                 "another, 0 for a free one, or leave --http-port out",
                 ("--nats-port", str(port)): f"--nats-port: port {port} is busy on 127.0.0.1",
                 ("--mqtt-port", str(port)): f"--mqtt-port: port {port} is busy on 127.0.0.1"}
        for done in run_all([["up", "--data-dir", str(tmp_path / "d"), *args] for args in cases]):
            assert_one_clear_line(done, cases[tuple(done.args[3:])])
        assert not (tmp_path / "d").exists()
        from p2pfaas.stack_settings import StackSettings   # the defaults are never refused, only replaced
        assert StackSettings(http_port=port, nats_port=port, mqtt_port=port).busy_ports(set()) == []
        assert StackSettings(http_port=port, mqtt="off", mqtt_port=port).busy_ports({"mqtt"}) == []


def test_without_a_running_stack_tools_ask_for_a_url(tmp_path):
    """No endpoints.json in the data dir (no `up` ever ran there): the tools that read it say so
    and ask for the URL; they used to fall back to the default local NATS, HTTP and MQTT ports and
    show whatever listened there, an empty table from the machine's own NATS with exit code 0."""
    where = ["--data-dir", str(tmp_path)]
    cases = {
        ("top", "--once", "2"): "--nats-url", ("top",): "--nats-url", ("farm", "run"): "--nats-url",
        ("controller",): "--nats-url", ("invoke", "fib", "--via", "nats"): "--nats-url",
        ("invoke", "fib"): "--url", ("invoke", "fib", "--via", "mqtt"): "--mqtt-url",
    }
    for done in run_all([[*args, *where] for args in cases]):
        flag = cases[tuple(done.args[:-2])]
        assert_one_clear_line(done, f"no running `p2pfaas up` found in {tmp_path} (no {tmp_path / 'endpoints.json'}): "
                                    f"start one, or give {flag}")
        assert not done.stdout
    assert not list(tmp_path.iterdir())


def test_invoke_refuses_an_unknown_node_and_a_timeout_that_is_not_positive(tmp_path):
    """--node names a node the stack has no HTTP bridge for: said, with the known ones (the
    default --via http used to send it to n1's bridge and print n1's answer, exit code 0)."""
    (tmp_path / "endpoints.json").write_text(json.dumps({   # as `up --mqtt off` writes it; nothing listens
        "nats_url": f"nats://127.0.0.1:{free_port()}", "mqtt_url": None, "prefix": "faas",
        "http": {"n1": f"http://127.0.0.1:{free_port()}", "n2": f"http://127.0.0.1:{free_port()}"}}))
    where = ["--data-dir", str(tmp_path)]
    unknown, no_mqtt, negative, zero = run_all([
        ["invoke", "fib", "--data", "5", "--node", "n9", *where], ["invoke", "fib", "--via", "mqtt", *where],
        ["invoke", "fib", "--timeout", "-1", *where], ["invoke", "fib", "--timeout", "0", *where]])
    assert_one_clear_line(unknown, f"no HTTP endpoint for node n9 in {tmp_path / 'endpoints.json'} (known: n1, n2): "
                                   "name one of them with --node, or give --url")
    assert_one_clear_line(no_mqtt, f"the `p2pfaas up` in {tmp_path} runs no MQTT (--mqtt off): give --mqtt-url")
    for done, value in ((negative, "-1"), (zero, "0")):   # was ValueError: Timeout value out of range
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"Invalid value for '--timeout': {value} is not more than 0 seconds" in done.stderr, done.stderr


def test_a_bridge_process_takes_its_settings_from_the_environment_and_passes_them_on(monkeypatch):
    """P2PFAAS_<FIELD> (limits as JSON or one by one), explicit values first; a sibling process of the
    bridge gets what its command line lacks; the tokens are never dumped."""
    monkeypatch.setenv("P2PFAAS_HTTP_LIMITS__CLIENT_CONNECTIONS", "8")
    monkeypatch.setenv("P2PFAAS_CALLBACK_HOSTS", "a.example,b.example")
    monkeypatch.setenv("P2PFAAS_PORT", "18081")
    settings = HttpBridgeSettings(node="n1", nats_url="nats://x:4222", port=18090, operator_token="secret")
    assert (settings.port, settings.callback_hosts, settings.http_limits.client_connections) \
        == (18090, ("a.example", "b.example"), 8)
    assert "secret" not in settings.model_dump_json() and "secret" not in repr(settings)
    for name, value in settings.sibling_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("P2PFAAS_HTTP_LIMITS__CLIENT_CONNECTIONS")
    sibling = HttpBridgeSettings(node="n1", nats_url="nats://x:4222")
    assert (sibling.http_limits, sibling.callback_hosts) == (settings.http_limits, settings.callback_hosts)
    monkeypatch.setenv("P2PFAAS_HTTP_LIMITS__CONNECTIONS", "none")
    with pytest.raises(ValueError, match="connections"):
        HttpBridgeSettings(node="n1", nats_url="nats://x:4222")
