"""P2PFaaS's learner API through the HTTP bridge, against a real learner over a real nats-server."""

from __future__ import annotations

import httpx
import orjson
import pytest

from broker.http_bridge import HttpBridge
from nodes.learner.service import LearnerService
from nodes.learner.settings import LearnerSettings

from support import eventually, serving

STATE = "X-P2pfaas-Learning-State"


@pytest.fixture
async def http(nats_server, nc, prefix, tmp_path):
    settings = LearnerSettings(node_ids=["n1"], nats_url=nats_server.url, prefix=prefix, data_dir=tmp_path,
                               weights_period_s=0.05, scheduling_parameters={"alpha": 0.2}, pools=["fib"])
    async with LearnerService(nc, settings):
        async with serving(HttpBridge(nc, "n1", prefix=prefix, max_payload_bytes=64 * 1024)) as client:
            yield client


async def stats_until(http: httpx.AsyncClient, predicate, timeout_s: float = 15.0) -> dict:
    async def stats() -> dict:
        return (await http.get("/learner/stats")).json()
    return await eventually(stats, predicate, timeout_s)


def sample(eid: int) -> dict:
    """Alternating states "1,0" / "0,1"; action 1 is right in the first, 0 in the second."""
    state, right = ("1,0", 1) if eid % 2 == 0 else ("0,1", 0)
    action = (eid // 2) % 2
    return {"eid": eid, "state": state, "action": action, "reward": float(action == right)}


async def test_act_returns_the_action_as_text_and_the_epsilon(http):
    r = await http.get("/learner/act", headers={STATE: "1, 0"})
    assert r.status_code == 200 and r.text in ("0", "1") and float(r.headers["X-P2pfaas-Eps"]) == pytest.approx(0.9)
    r = await http.get("/learner/act", headers={STATE: "1,0"})
    assert float(r.headers["X-P2pfaas-Eps"]) == pytest.approx(0.891)
    r = await http.get("/learner/act", params={"explore": "false"}, headers={STATE: "1,0"})
    assert r.text == "1" and float(r.headers["X-P2pfaas-Eps"]) == 0.0   # untrained: run here, never reject


async def test_train_and_train_batch_go_through_the_stream_and_change_the_policy(http):
    for eid in range(4):
        s = sample(eid)
        r = await http.get("/learner/train", headers={
            "X-P2pfaas-Learning-Eid": str(eid), STATE: s["state"],
            "X-P2pfaas-Learning-Action": str(s["action"]), "X-P2pfaas-Learning-Reward": str(s["reward"])})
        assert r.status_code == 200 and r.text == "ok"
    r = await http.post("/learner/train_batch", content=orjson.dumps([sample(eid) for eid in range(4, 200)]))
    assert r.status_code == 200 and r.text == "ok"
    stats = await stats_until(http, lambda st: st["stream_seq"] == 200)
    assert stats["experiences"] == 196 and stats["agent"]["trained_items"] == 196
    assert (await http.get("/learner/act", params={"explore": "false"}, headers={STATE: "1,0"})).text == "1"
    assert (await http.get("/learner/act", params={"explore": "false"}, headers={STATE: "0,1"})).text == "0"

    weights = (await http.get("/learner/weights")).json()
    assert weights["algorithm"] == "dsarsa" and weights["version"] == 196 and weights["weights_b64"]
    r = await http.get("/learner/reset")
    assert r.status_code == 200 and r.json()["experiences"] == 0 and r.json()["agent"]["states"] == 0
    # forgotten: the safe default again for both states (the trained policy said 0 for "0,1")
    assert (await http.get("/learner/act", params={"explore": "false"}, headers={STATE: "0,1"})).text == "1"


async def test_parameters_get_and_set(http):
    params = (await http.get("/learner/parameters")).json()
    assert params["actions_n"] == 2 and params["alpha"] == 0.2 and params["epsilon_start"] == 0.9
    r = await http.post("/learner/parameters", content=orjson.dumps({"actions_n": "5", "beta": "0.05"}))
    assert r.status_code == 200 and r.json()["actions_n"] == 5 and r.json()["beta"] == 0.05
    assert (await http.get("/learner/parameters")).json() == r.json()
    fib = (await http.get("/learner/parameters", params={"model": "scaling-fib"})).json()
    assert fib["actions_n"] == 7 and fib["hidden_sizes"] == [64, 64]  # a pool's DQN (the target actions)


BAD_REQUESTS = [
    ("GET", "/learner/act", {}),                                                   # no state header
    ("GET", "/learner/act", {"headers": {STATE: "a,b"}}),
    ("GET", "/learner/act", {"headers": {STATE: "1,,2"}}),
    ("GET", "/learner/act", {"headers": {STATE: "1,inf"}}),
    ("GET", "/learner/act", {"headers": {STATE: "1"}, "params": {"model": "bad.model"}}),
    ("GET", "/learner/train", {"headers": {STATE: "1,0"}}),                        # eid, action, reward missing
    ("GET", "/learner/train", {"headers": {"X-P2pfaas-Learning-Eid": "x", STATE: "1", "X-P2pfaas-Learning-Action": "1",
                                           "X-P2pfaas-Learning-Reward": "1"}}),
    ("GET", "/learner/train", {"headers": {"X-P2pfaas-Learning-Eid": "1", STATE: "1", "X-P2pfaas-Learning-Action": "-1",
                                           "X-P2pfaas-Learning-Reward": "1"}}),
    ("POST", "/learner/train_batch", {"content": b"{"}),
    ("POST", "/learner/train_batch", {"content": b'{"eid": 1}'}),
    ("POST", "/learner/train_batch", {"content": b'[{"eid": 1, "state": "a,b", "action": 0, "reward": 1}]'}),
    ("POST", "/learner/parameters", {"content": b"[1]"}),
    ("POST", "/learner/parameters", {"content": b'{"alpha": "fast"}'}),
    ("POST", "/learner/parameters", {"content": b'{"no_such_parameter": 1}'}),
]


async def test_bad_input_is_400_with_a_json_reason(http):
    for method, path, kwargs in BAD_REQUESTS:
        r = await http.request(method, path, **kwargs)
        assert r.status_code == 400, (path, kwargs, r.text)
        body = r.json()
        assert set(body) == {"code", "message"} and body["code"] == 4 and body["message"]   # P2PFaaS: input not valid
    assert (await http.get("/learner/stats")).json()["stream_seq"] == 0  # nothing bad was stored


async def test_unknown_model_404_and_no_learner_503(http, nc, prefix):
    r = await http.get("/learner/stats", params={"model": "nosuchmodel"})
    assert r.status_code == 404 and r.json()["code"] == 3
    r = await http.get("/learner/weights", params={"model": "scaling-fib"})  # exists only once it has seen a state
    assert r.status_code == 404
    async with serving(HttpBridge(nc, "n9", prefix=prefix, control_timeout_s=0.5)) as other:
        assert (await other.get("/learner/stats")).status_code == 503
        r = await other.get("/learner/train", headers={"X-P2pfaas-Learning-Eid": "1", STATE: "1",
                                                       "X-P2pfaas-Learning-Action": "0", "X-P2pfaas-Learning-Reward": "1"})
        assert r.status_code == 503 and r.json()["code"] == 1  # no stream for n9: nothing stored


async def test_p2pfaas_learner_and_discovery_ports_answer_errors_with_their_status(nc, prefix):
    """The learner (19020) and discovery (19000) ports answer a body too large 413 and a change
    without the operator's token 401, as the main port does (not a plain 500)."""
    bridge = HttpBridge(nc, "n1", prefix=prefix, max_payload_bytes=1024, operator_token="secret")
    async with serving(bridge):
        for app in (bridge.learner_app, bridge.discovery_app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://port") as port:
                assert (await port.get("/")).status_code == 200
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=bridge.learner_app),
                                     base_url="http://learner") as learner:
            r = await learner.post("/train_batch", content=b"[" + b" " * 4096 + b"]",
                                   headers={"Authorization": "Bearer secret"})
            assert r.status_code == 413 and r.json()["code"] == 4 and "limit" in r.json()["message"]
            r = await learner.get("/train", headers={"X-P2pfaas-Learning-Eid": "1", STATE: "1",
                                                     "X-P2pfaas-Learning-Action": "0", "X-P2pfaas-Learning-Reward": "1"})
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer" and r.json()["message"]
