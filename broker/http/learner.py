"""P2PFaaS's learner API over HTTP (docs/learner.md): act and the model's controls are
request/reply with the node's learner; train and train_batch store experiences on the node's
durable reward stream (answered once JetStream has them)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from broker.codec import decode, encode
from broker.control import control_request
from broker.errors import ContractError
from broker.http.invoke import error
from broker.messages import LearnerAction, LearnerActRequest, LearnerTrainBatch, LearnerTrainSample, SchedulingExperience
from broker.subjects import SCHEDULING_MODEL, LearnerVerb

if TYPE_CHECKING:
    from broker.http_bridge import HttpBridge

LEARNING_HEADER = "X-P2pfaas-Learning-"     # + Eid, State, Action, Reward (P2PFaaS learner API)
LEARNING_EPS = "X-P2pfaas-Eps"


def learner_router(bridge: "HttpBridge") -> APIRouter:
    router = APIRouter(prefix="/learner", tags=["learner"])

    async def control(model: str, verb: LearnerVerb, body: bytes = b"") -> Response:
        subject = bridge.subjects.learner(bridge.node, model, verb)   # InvalidToken -> 400
        status, data = await control_request(bridge.nc, subject, body, bridge.control_timeout_s)
        return Response(data, status_code=status, media_type="application/json")

    async def store(samples: list[LearnerTrainSample]) -> Response:
        js = bridge.nc.jetstream()
        subject = bridge.subjects.reward(bridge.node)
        try:
            for i in range(0, len(samples), 256):  # pipelined, a bounded number in flight
                await asyncio.gather(*(js.publish(subject, encode(SchedulingExperience(
                    eid=s.eid, state=s.state, action=s.action, reward=s.reward, node=bridge.node)))
                    for s in samples[i:i + 256]))
        except Exception as exc:  # not stored: the client must send them again
            return error(503, f"experiences of {bridge.node} not stored: {exc!r}", **{"Retry-After": "1"})
        return Response("ok", media_type="text/plain")

    @router.get("/act", summary="P2PFaaS learner: action for X-P2pfaas-Learning-State (+ X-P2pfaas-Eps)")
    async def learner_act(request: Request, model: str = SCHEDULING_MODEL, explore: bool = True) -> Response:
        state = request.headers.get(LEARNING_HEADER + "State")
        if state is None:
            return error(400, f"missing header {LEARNING_HEADER}State: \"f1,f2,...\"")
        try:
            body = encode(decode(LearnerActRequest, orjson.dumps({"state": state, "explore": explore})))
        except ContractError as exc:
            return error(400, str(exc))
        response = await control(model, "act", body)
        if response.status_code != 200:
            return response
        action = decode(LearnerAction, response.body)
        return Response(str(action.action), media_type="text/plain", headers={LEARNING_EPS: repr(action.eps)})

    @router.get("/train", summary="P2PFaaS learner: one sample from X-P2pfaas-Learning-{Eid,State,Action,Reward}")
    async def learner_train(request: Request) -> Response:
        names = ("Eid", "State", "Action", "Reward")
        missing = [LEARNING_HEADER + n for n in names if LEARNING_HEADER + n not in request.headers]
        if missing:
            return error(400, f"missing header(s) {', '.join(missing)}")
        fields = {n.lower(): request.headers[LEARNING_HEADER + n] for n in names}
        try:
            sample = decode(LearnerTrainSample, orjson.dumps(fields))
        except ContractError as exc:
            return error(400, str(exc))
        return await store([sample])

    @router.post("/train_batch", summary="P2PFaaS learner: JSON list of {eid, state, action, reward}")
    async def learner_train_batch(request: Request) -> Response:
        try:
            batch = decode(LearnerTrainBatch, await bridge.read_body(request))
        except ContractError as exc:
            return error(400, str(exc))
        return await store(batch.root)

    @router.get("/parameters", summary="Learner hyper-parameters")
    async def learner_parameters(model: str = SCHEDULING_MODEL) -> Response:
        return await control(model, "parameters.get")

    @router.post("/parameters", summary="Change learner hyper-parameters at run time")
    async def learner_set_parameters(request: Request, model: str = SCHEDULING_MODEL) -> Response:
        return await control(model, "parameters.set", await bridge.read_body(request))

    @router.get("/stats", summary="Learner statistics")
    async def learner_stats(model: str = SCHEDULING_MODEL) -> Response:
        return await control(model, "stats")

    @router.get("/weights", summary="Current model weights (base64 torch payload + shape)")
    async def learner_weights(model: str = SCHEDULING_MODEL) -> Response:
        return await control(model, "weights.get")

    @router.get("/reset", summary="Forget what the model learned")
    async def learner_reset(model: str = SCHEDULING_MODEL) -> Response:
        return await control(model, "reset")

    return router
