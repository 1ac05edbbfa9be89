"""P2PFaaS's wire shapes, both directions (pure): PeerJobResponse <-> answers, learner samples."""

from __future__ import annotations

import base64

import orjson
import pytest

from broker import headers as H
from broker.answers import Answer, answer_headers, name_list
from broker.errors import ContractError
from broker.http.learner import p2pfaas_sample
from broker.http.peer import peer_response
from broker.messages import HopTiming
from nodes.peer_http import answer_of


def test_a_peer_job_response_becomes_an_answer_with_the_path_origin_first():
    reply = {"peers_list": [{"machine_id": "10.0.0.9", "machine_ip": "10.0.0.9",
                             "timings": {"execution_time": 0.01, "total_time": 0.03, "scheduling_time": 0.002}}],
             "body": base64.b64encode(b"out").decode(), "status_code": 200}
    answer = answer_of(200, orjson.dumps(reply), node="n1", ip="10.0.0.1")
    assert answer.status == 200 and answer.body == b"out" and answer.hops == 1
    assert answer.peers == ["n1", "10.0.0.9"] and answer.peer_ips == ["10.0.0.1", "10.0.0.9"]
    assert orjson.loads(answer.headers[H.TIMING_TOTAL]) == [0.03] and answer.timings.execution_s == 0.01
    garbled = answer_of(200, b"<html>", node="n1", ip="10.0.0.1")
    assert garbled.status == 500 and garbled.code == 404   # P2PFaaS: peer response nil


def test_an_answer_becomes_a_peer_job_response_with_the_executor_first():
    hops = [HopTiming(node="http-10-0-0-9", total_s=0.5), HopTiming(node="n1", total_s=0.4, probing_s=0.01),
            HopTiming(node="n2", total_s=0.2)]
    headers = answer_headers(status=200, scheduler="PowerOfNScheduler(1, 2, true, 1)", executed_by="n2", hops=hops,
                             execution_s=0.1, queueing_s=0.0, forwards=2, peers=["http-10-0-0-9", "n1", "n2"],
                             peer_ips=["10.0.0.9", "10.0.0.1", "10.0.0.2"])
    assert name_list(headers[H.PEERS_LIST_ID]) == ["http-10-0-0-9", "n1", "n2"]
    reply = peer_response(Answer(200, b"out", headers), "n1", "10.0.0.1")
    assert [p["machine_id"] for p in reply["peers_list"]] == ["n2", "n1"]   # the P2PFaaS sender is not listed
    assert reply["peers_list"][0]["timings"] == {"total_time": 0.2, "scheduling_time": 0.0, "probing_time": 0.0,
                                                 "execution_time": 0.1}
    assert base64.b64decode(reply["body"]) == b"out" and reply["status_code"] == 200
    refused = peer_response(Answer(500, b'{"code":400,"message":"full"}', {H.STATUS: "500"}), "n1", "10.0.0.1")
    assert refused["peers_list"] == [{"machine_id": "n1", "machine_ip": "10.0.0.1", "timings": {}}]
    assert refused["status_code"] == 500


def test_learner_samples_as_p2pfaas_clients_send_them():
    sample = p2pfaas_sample({"eid": "17", "state": "1,0,2", "action": "3.000000", "reward": 1.0, "extra": "x"})
    assert (sample.eid, sample.state, sample.action, sample.reward) == (17, [1.0, 0.0, 2.0], 3, 1.0)
    for bad in ({"eid": "x", "state": "1", "action": "1", "reward": 1}, {"eid": 1, "state": "", "action": 1, "reward": 1},
                ["not", "a", "dict"]):
        with pytest.raises(ContractError):
            p2pfaas_sample(bad)
