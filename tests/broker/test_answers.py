"""Reading an answer never fails on what a peer or worker wrote: timings that are not numbers
read as 0, a status that is not an HTTP status reads as 500 (an HTTP server could not send it)."""

from __future__ import annotations

import pytest

from broker import headers as H
from broker.answers import Answer, status_of
from nodes.peer_http import answer_of


@pytest.mark.parametrize("value", ["n/a", "", "nan", "inf", "-inf", "1e999", "0x10", " "])
def test_timings_that_are_not_finite_numbers_read_as_zero(value):
    headers = {H.TIMING_EXECUTION: value, H.TIMING_QUEUEING: value, H.TIMING_TRANSIT: value,
               H.TIMING_TOTAL: f"[{value or 0}]" if value.replace(".", "").isdigit() else "[1e999, \"x\"]"}
    timings = Answer(200, b"ok", headers).timings
    assert (timings.execution_s, timings.queueing_s, timings.transit_s) == (0.0, 0.0, 0.0)
    assert timings.total_s == 0.0


def test_good_timings_are_read():
    headers = {H.TIMING_EXECUTION: "0.25", H.TIMING_QUEUEING: "0.5", H.TIMING_TRANSIT: "0.001",
               H.TIMING_TOTAL: "[1.5, 0.75]", H.TIMING_SCHEDULING: "[0.01, 0.02]"}
    timings = Answer(200, b"ok", headers).timings
    assert (timings.execution_s, timings.queueing_s, timings.transit_s) == (0.25, 0.5, 0.001)
    assert (timings.total_s, timings.scheduling_s) == (1.5, 0.01)


@pytest.mark.parametrize("value, status", [("200", 200), ("404", 404), ("599", 599), ("100", 100), (None, 200),
                                           ("999", 500), ("99", 500), ("0", 500), ("", 500), ("abc", 500),
                                           ("-1", 500), ("2OO", 500), ("٣٠٠", 500)])
def test_status_of_gives_an_http_status(value, status):
    assert status_of(value) == status


def test_a_p2pfaas_peer_answering_an_impossible_status_code_is_a_500():
    answer = answer_of(200, b'{"status_code": 999, "body": "", "peers_list": []}', node="n1", ip="")
    assert answer.status == 500
