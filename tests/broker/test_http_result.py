"""``GET /result/{id}`` read from JetStream: every bridge process of a node (``up --http-processes``,
a bridge restarted after the submit) answers the same for the same call, over a real node."""

from __future__ import annotations

import asyncio
import contextlib

from broker import headers as H
from broker.codec import encode
from broker.connection import close_quietly, connect
from broker.http_bridge import HttpBridge
from broker.messages import Result
from broker.streams import async_stream, ensure_shared_streams, results_stream
from broker.subjects import Subjects
from support import eventually, serving


@contextlib.asynccontextmanager
async def bridge_process(nats_server, prefix: str, name: str):
    """A bridge of node n1 on a NATS connection of its own, as each bridge process has."""
    conn = await connect(nats_server.url, name)
    try:
        bridge = HttpBridge(conn, "n1", prefix=prefix, control_timeout_s=5)
        async with serving(bridge) as http:
            yield bridge, http
    finally:
        await close_quietly(conn)


async def test_a_call_submitted_through_one_bridge_process_is_pending_then_answered_through_another(
        node_factory, nats_server, prefix):
    async with node_factory(k=1), bridge_process(nats_server, prefix, "bridge-a") as (_, a), \
            bridge_process(nats_server, prefix, "bridge-b") as (_, b):
        r = await a.post("/async-function/sleep", content=b"1")
        assert r.status_code == 202
        call_id = r.headers[H.CALL_ID]
        pending = await b.get(f"/result/{call_id}")   # the kernel handed the poll to the other process
        assert pending.status_code == 202 and pending.json() == {"call_id": call_id, "status": "pending"}
        assert pending.headers[H.CALL_ID] == call_id and pending.headers[H.RETRY_AFTER] == "1"
        statuses: list[int] = []

        async def poll():
            r = await b.get(f"/result/{call_id}")
            statuses.append(r.status_code)
            return r

        done = await eventually(poll, lambda r: r.status_code != 202, timeout_s=15, interval_s=0.01)
        assert done.status_code == 200 and done.content == b"slept 1.000000", done.text
        assert set(statuses) == {202, 200}   # pending until answered, never "unknown" on the way
        assert (await a.get(f"/result/{call_id}")).content == done.content
        unknown = await b.get("/result/unknown123")
        assert unknown.status_code == 404 and "unknown" in unknown.json()["message"]


async def test_a_bridge_started_after_the_submit_answers_pending_then_the_result(node_factory, nats_server, prefix):
    async with node_factory():
        pass   # the streams exist; the node is stopped, so the call waits in the intake
    async with bridge_process(nats_server, prefix, "bridge-before") as (_, before):
        r = await before.post("/async-function/echo", content=b"kept")
        assert r.status_code == 202
        call_id = r.headers[H.CALL_ID]
    async with bridge_process(nats_server, prefix, "bridge-after") as (_, after):   # issued no call itself
        r = await after.get(f"/result/{call_id}")
        assert r.status_code == 202 and r.json()["status"] == "pending", r.text
        async with node_factory():
            r = await eventually(lambda: after.get(f"/result/{call_id}"), lambda r: r.status_code != 202, timeout_s=15)
        assert r.status_code == 200 and r.content == b"kept"


async def test_a_call_answered_between_the_two_looks_is_not_taken_for_unknown(nc, nats_server, prefix, monkeypatch):
    """The node stores the answer, then removes the task. When both happen after the bridge looked
    for the answer and before it looked for the task, it finds neither: it looks for the answer
    again, and answers with it (the node is played by the test, to put its steps in between)."""
    subjects = Subjects(prefix)
    js = nc.jetstream()
    await ensure_shared_streams(js, subjects)
    async with bridge_process(nats_server, prefix, "bridge") as (bridge, http):
        r = await http.post("/async-function/echo", content=b"x")
        assert r.status_code == 202
        call_id = r.headers[H.CALL_ID]
        faas, looks = bridge.faas, []
        real_answer, real_call = faas.stored_answer, faas.stored_call
        node_done = asyncio.Event()

        async def answer_then_the_node_answers(client: str, req: str):
            answer = await real_answer(client, req)
            looks.append(("answer", answer is not None))
            if not node_done.is_set():   # what the node does: store the answer, then remove the task
                result = Result(request_id=req, client=client, fn="echo", status=200, output="answered",
                                executed_by="n1", origin="n1")
                await js.publish(subjects.result(client, req), encode(result), stream=results_stream(subjects))
                task = await js.get_last_msg(async_stream(subjects), subjects.async_call(client, req))
                await js.delete_msg(async_stream(subjects), task.seq)
                node_done.set()
            return answer

        async def call_after_the_node(client: str, req: str) -> bool:
            await asyncio.wait_for(node_done.wait(), 5)
            waiting = await real_call(client, req)
            looks.append(("task", waiting))
            return waiting

        monkeypatch.setattr(faas, "stored_answer", answer_then_the_node_answers)
        monkeypatch.setattr(faas, "stored_call", call_after_the_node)
        r = await http.get(f"/result/{call_id}")
        assert r.status_code == 200 and r.content == b"answered", r.text
        assert looks == [("answer", False), ("task", False), ("answer", True)]
