"""Functions as a faas-cli user deploys them, on a real `up` of two nodes: a deploy reaches every
node (it reached one: n2 said "unknown function"), envVars reach the function (they were dropped
in silence), `describe` and `list` show them, `remove` removes them everywhere; the same through
the OpenFaaS routes; what is not supported is refused, not ignored."""

from __future__ import annotations

import hashlib
import os
import subprocess
import textwrap

import httpx
import pytest

from broker.embedded import free_port
from stack_processes import P2PFAAS, wait_endpoints


@pytest.fixture
def greeter(tmp_path_factory, monkeypatch):
    code = tmp_path_factory.mktemp("greetfns")
    (code / "greetfns.py").write_text(textwrap.dedent("""
        import os

        def greet(payload: bytes) -> bytes:
            print(f"greeting {payload.decode()}")   # what `p2pfaas logs greet` shows
            return f"{os.environ.get('GREETING', '(none)')}, {payload.decode()}".encode()

        def shout(payload: bytes) -> bytes:
            return payload.upper()

        def keeper(payload: bytes) -> bytes:
            import hashlib
            import functions
            return hashlib.sha256(functions.secret("api-key").encode()).hexdigest().encode()
    """))
    code.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", f"{code}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return code


def p2pfaas(data_dir, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*P2PFAAS, *args, "--data-dir", str(data_dir)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "COLUMNS": "80"})


def test_deploy_reaches_every_node_with_its_environment(tmp_path, start_up, greeter):
    proc = start_up(tmp_path, "--nodes", "2", "--runtime", "process", "--http-port", "0", "--nats-port",
                    str(free_port()), "--mqtt", "off", "--controller", "off")
    http = wait_endpoints(proc, tmp_path)["http"]
    done = p2pfaas(tmp_path, "deploy", "greet", "--ref", "greetfns:greet", "-e", "GREETING=hello", "-l",
                   "team=edge", "--annotation", "owner=ops")
    assert done.returncode == 0 and done.stdout.strip() == "deployed greet on n1, n2", (done.stdout, done.stderr)
    answer = httpx.post(f"{http['n2']}/function/greet", content=b"world", timeout=30)
    assert answer.status_code == 200 and answer.text == "hello, world"   # on the node it was not deployed on

    described = p2pfaas(tmp_path, "describe", "greet", "--node", "n2")
    assert described.returncode == 0, described.stderr
    assert "reference    greetfns:greet" in described.stdout and "  GREETING=hello" in described.stdout
    assert "  team=edge" in described.stdout and "  owner=ops" in described.stdout
    for _ in range(100):   # the node logs its worker's output as it comes
        logged = p2pfaas(tmp_path, "logs", "greet")
        if "greeting world" in logged.stdout:
            break
    assert logged.returncode == 0 and "[fn greet] greeting world" in logged.stdout, (logged.stdout, logged.stderr)
    assert logged.stdout.splitlines()[0].startswith("node-n2  "), logged.stdout   # from the node that ran it
    listed = p2pfaas(tmp_path, "list", "--node", "n2")
    assert listed.returncode == 0 and all(len(line) <= 80 for line in listed.stdout.splitlines())
    assert any(line.split()[:1] == ["greet"] and "catalogue" in line for line in listed.stdout.splitlines())

    stack = tmp_path / "stack.yml"
    stack.write_text("functions:\n  shout:\n    reference: greetfns:shout\n    labels: {tier: one}\n")
    done = p2pfaas(tmp_path, "deploy", "-f", str(stack))
    assert done.returncode == 0 and done.stdout.strip() == "deployed shout on n1, n2", done.stderr
    assert httpx.post(f"{http['n2']}/function/shout", content=b"hey", timeout=30).text == "HEY"

    done = p2pfaas(tmp_path, "remove", "greet", "--node", "n2")
    assert done.returncode == 0 and done.stdout.strip() == "removed greet on n1, n2", done.stderr
    assert httpx.post(f"{http['n1']}/function/greet", content=b"x", timeout=30).status_code == 404
    gone = p2pfaas(tmp_path, "remove", "greet")
    assert gone.returncode == 2 and "no function 'greet' is deployed" in gone.stderr, gone.stderr

    # the OpenFaaS routes: deployment-wide too, envVars honoured, what is not supported refused
    token = subprocess.run([*P2PFAAS, "auth", "operator", "--data-dir", str(tmp_path)], capture_output=True,
                           text=True, timeout=60).stdout.strip()
    auth = {"Authorization": f"Bearer {token}"}
    body = {"service": "greet2", "reference": "greetfns:greet", "envVars": {"GREETING": "hi"}}
    refused = httpx.post(f"{http['n1']}/system/functions", json={**body, "secrets": ["api-key"]}, headers=auth,
                         timeout=60)
    assert refused.status_code == 404 and "no secret 'api-key'" in refused.text   # none made yet
    refused = httpx.post(f"{http['n1']}/system/functions", json={**body, "colour": "red"}, headers=auth, timeout=60)
    assert refused.status_code == 400 and "colour: unknown" in refused.text
    made = httpx.post(f"{http['n1']}/system/functions", json={**body, "secrets": [], "namespace": "openfaas-fn"},
                      headers=auth, timeout=90)
    assert made.status_code == 200, made.text
    for _ in range(100):   # n2 applies it within seconds
        seen = httpx.get(f"{http['n2']}/system/function/greet2", timeout=10)
        if seen.status_code == 200:
            break
    assert seen.status_code == 200 and seen.json()["envVars"] == {"GREETING": "hi"}, seen.text
    assert httpx.post(f"{http['n2']}/function/greet2", content=b"you", timeout=30).text == "hi, you"

    clash = p2pfaas(tmp_path, "deploy", "greet3", "--ref", "greetfns:greet", "-e", "GREETING=other")
    assert clash.returncode == 2 and "GREETING (set by greet2 to another value)" in clash.stderr, clash.stderr

    # a secret, and a function with a pool of its own that scales to zero (faas-cli's verbs)
    value = "s3cr3t-" + os.urandom(6).hex()
    made = p2pfaas(tmp_path, "secret", "create", "api-key", "--from-literal", value)
    assert made.returncode == 0, made.stderr
    assert p2pfaas(tmp_path, "secret", "list").stdout.split() == ["api-key"]
    typo = p2pfaas(tmp_path, "deploy", "keeper", "--ref", "greetfns:keeper", "--policy", "kpaa")
    assert typo.returncode == 2 and "did you mean kpa" in typo.stderr, typo.stderr
    done = p2pfaas(tmp_path, "deploy", "keeper", "--ref", "greetfns:keeper", "--secret", "api-key",
                   "--scale-to-zero-after", "3s", "--max", "2", "--policy", "off")
    assert done.returncode == 0 and done.stdout.strip() == "deployed keeper on n1, n2", (done.stdout, done.stderr)
    answer = httpx.post(f"{http['n2']}/function/keeper", content=b"x", timeout=60)
    assert answer.status_code == 200 and answer.text == hashlib.sha256(value.encode()).hexdigest(), answer.text
    assert float(answer.headers["X-P2pfaas-Cold-Start-Seconds"]) > 0   # it was asleep: deployed with min 0
    described = p2pfaas(tmp_path, "describe", "keeper", "--node", "n2")
    assert "secrets      api-key" in described.stdout and "  com.openfaas.scale.zero=true" in described.stdout
    in_use = p2pfaas(tmp_path, "secret", "remove", "api-key")
    assert in_use.returncode == 2 and "used by keeper" in in_use.stderr, in_use.stderr
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert value.encode() not in stored   # not in the logs, the stream store, any file
