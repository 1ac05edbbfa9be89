"""P2PFaaS's learner API over HTTP (docs/learner.md): ``/learner/*`` on the main port in p2pfaas's JSON, and
the original service's API on its own port (19020). Samples are stored once per ``reward.<node>.<eid>``."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from broker import codes
from broker import headers as H
from broker.answers import VERSION
from broker.codec import decode, encode
from broker.control import control_request
from broker.errors import ContractError
from broker.http.invoke import error, port_app
from broker.messages import (
    ErrorBody,
    LearnerAction,
    LearnerActRequest,
    LearnerTrainBatch,
    LearnerTrainSample,
    SchedulingExperience,
)
from broker.subjects import SCHEDULING_MODEL, LearnerVerb

if TYPE_CHECKING:
    from broker.http.bridge import Bridge

LEARNING_HEADER = H.LEARNER_PREFIX
LEARNING_EPS = H.LEARNER_EPS
SAMPLE_FIELDS = ("eid", "state", "action", "reward")
LEARNER_NAME = "p2pfaas-learner"
P2PFAAS_MODEL_NAMES = {"dsarsa": "SarsaQTable"}   # our differential SARSA is its SarsaQTable, fixed


class LearnerGateway:
    """One node's learner, as the HTTP routes reach it."""

    def __init__(self, bridge: "Bridge") -> None:
        self.bridge = bridge

    async def control(self, model: str, verb: LearnerVerb, body: bytes = b"") -> tuple[int, bytes]:
        """(status, body) of a learner request; an error body carries P2PFaaS's catalogue code."""
        subject = self.bridge.subjects.learner(self.bridge.node, model, verb)   # InvalidToken -> 400
        status, data = await control_request(self.bridge.nc, subject, body, self.bridge.control_timeout_s)
        if status != 200:
            try:
                err = decode(ErrorBody, data)
                data = orjson.dumps({"code": codes.for_status(status), "message": err.message})
            except ContractError:
                pass
        return status, data

    async def respond(self, model: str, verb: LearnerVerb, body: bytes = b"") -> Response:
        status, data = await self.control(model, verb, body)
        return Response(data, status_code=status, media_type="application/json")

    async def store(self, samples: list[LearnerTrainSample]) -> Response:
        """Stored on the durable reward stream, then ``ok``; 503 when not stored (send them again)."""
        js = self.bridge.nc.jetstream()
        node = self.bridge.node
        subject = self.bridge.subjects.reward(node)
        try:
            for i in range(0, len(samples), 256):  # pipelined, a bounded number in flight
                experiences = [SchedulingExperience(eid=s.eid, state=s.state, action=s.action, reward=s.reward, node=node)
                               for s in samples[i:i + 256]]
                await asyncio.gather(*(js.publish(subject, encode(e), headers={H.MSG_ID: e.msg_id})
                                       for e in experiences))
        except Exception as exc:  # not stored: the client must send them again
            return error(503, f"experiences of {node} not stored: {exc!r}", **{H.RETRY_AFTER: "1"})
        return Response("ok", media_type="text/plain")

    async def act(self, request: Request, model: str, explore: bool) -> Response:
        state = request.headers.get(LEARNING_HEADER + "State")
        if state is None:
            return error(400, f"missing header {LEARNING_HEADER}State: \"f1,f2,...\"")
        try:
            body = encode(decode(LearnerActRequest, orjson.dumps({"state": state, "explore": explore})))
        except ContractError as exc:
            return error(400, str(exc))
        response = await self.respond(model, "act", body)
        if response.status_code != 200:
            return response
        action = decode(LearnerAction, response.body)
        return Response(str(action.action), media_type="text/plain", headers={LEARNING_EPS: repr(action.eps)})

    def sample_from_headers(self, request: Request) -> LearnerTrainSample | Response:
        names = ("Eid", "State", "Action", "Reward")
        missing = [LEARNING_HEADER + n for n in names if LEARNING_HEADER + n not in request.headers]
        if missing:
            return error(400, f"missing header(s) {', '.join(missing)}")
        try:
            return p2pfaas_sample({n.lower(): request.headers[LEARNING_HEADER + n] for n in names})
        except ContractError as exc:
            return error(400, str(exc))


def p2pfaas_sample(entry: Any) -> LearnerTrainSample:
    """A sample as P2PFaaS's clients send it (``eid``, ``action`` may be text)."""
    if not isinstance(entry, dict):
        raise ContractError(f"a sample must be a JSON object with {', '.join(SAMPLE_FIELDS)}")
    fields = {k: entry[k] for k in SAMPLE_FIELDS if k in entry}
    try:
        if isinstance(fields.get("action"), str):
            fields["action"] = int(float(fields["action"]))
        if isinstance(fields.get("eid"), str):
            fields["eid"] = int(fields["eid"])
    except ValueError as exc:
        raise ContractError(f"sample {entry!r}: {exc}") from None
    return decode(LearnerTrainSample, orjson.dumps(fields))


def learner_router(bridge: "Bridge") -> APIRouter:
    """``/learner/*`` on the node's main port: p2pfaas's own shapes; ``?model=`` picks the model."""
    router = APIRouter(prefix="/learner", tags=["learner"])
    gateway = LearnerGateway(bridge)

    @router.get("/act", summary="P2PFaaS learner: action for X-P2pfaas-Learning-State (+ X-P2pfaas-Eps)")
    async def learner_act(request: Request, model: str = SCHEDULING_MODEL, explore: bool = True) -> Response:
        return await gateway.act(request, model, explore)

    @router.get("/train", summary="P2PFaaS learner: one sample from X-P2pfaas-Learning-{Eid,State,Action,Reward}",
                dependencies=[bridge.changes_state])
    async def learner_train(request: Request) -> Response:
        sample = gateway.sample_from_headers(request)
        return sample if isinstance(sample, Response) else await gateway.store([sample])

    @router.post("/train_batch", summary="P2PFaaS learner: JSON list of {eid, state, action, reward}",
                 dependencies=[bridge.changes_state])
    async def learner_train_batch(request: Request) -> Response:
        try:
            batch = decode(LearnerTrainBatch, await bridge.read_body(request))
        except ContractError as exc:
            return error(400, str(exc))
        return await gateway.store(batch.root)

    @router.get("/parameters", summary="Learner hyper-parameters")
    async def learner_parameters(model: str = SCHEDULING_MODEL) -> Response:
        return await gateway.respond(model, "parameters.get")

    @router.post("/parameters", summary="Change learner hyper-parameters at run time", dependencies=[bridge.changes_state])
    async def learner_set_parameters(request: Request, model: str = SCHEDULING_MODEL) -> Response:
        return await gateway.respond(model, "parameters.set", await bridge.read_body(request))

    @router.get("/stats", summary="Learner statistics")
    async def learner_stats(model: str = SCHEDULING_MODEL) -> Response:
        return await gateway.respond(model, "stats")

    @router.get("/weights", summary="Current model weights (base64 torch payload + shape)")
    async def learner_weights(model: str = SCHEDULING_MODEL) -> Response:
        return await gateway.respond(model, "weights.get")

    @router.get("/reset", summary="Forget what the model learned", dependencies=[bridge.changes_state])
    async def learner_reset(model: str = SCHEDULING_MODEL) -> Response:
        return await gateway.respond(model, "reset")

    return router


# -- P2PFaaS's learner service (port 19020) ------------------------------------------------------
def learner_app(bridge: "Bridge") -> FastAPI:
    """The original learner's routes and bodies for the node's scheduling model (docs/compat.md)."""
    app = port_app("p2pfaas learner API (P2PFaaS-compatible)", f"This is {LEARNER_NAME} v{VERSION}.")
    gateway = LearnerGateway(bridge)
    model = SCHEDULING_MODEL

    @app.get("/act", summary="Action for X-P2pfaas-Learning-State as text, epsilon in X-P2pfaas-Eps")
    async def act(request: Request) -> Response:
        return p2pfaas_error(await gateway.act(request, model, explore=True))

    @app.get("/train", summary="One sample from X-P2pfaas-Learning-{Eid,State,Action,Reward}: ok",
             dependencies=[bridge.changes_state_p2pfaas])
    async def train(request: Request) -> Response:
        sample = gateway.sample_from_headers(request)
        return p2pfaas_error(sample if isinstance(sample, Response) else await gateway.store([sample]))

    @app.post("/train_batch", summary="JSON list of {eid, state: \"a,b\", action, reward}: ok",
              dependencies=[bridge.changes_state_p2pfaas])
    async def train_batch(request: Request) -> Response:
        try:
            entries = orjson.loads(await bridge.read_body(request))
            if not isinstance(entries, list) or not entries:
                raise ContractError("train_batch takes a non-empty JSON list of samples")
            samples = [p2pfaas_sample(entry) for entry in entries]
        except (orjson.JSONDecodeError, ContractError) as exc:
            return p2pfaas_error(error(400, str(exc)))
        return p2pfaas_error(await gateway.store(samples))

    @app.get("/learner/parameters", summary="{name, parameters} of the scheduling model")
    async def parameters() -> Response:
        status, data = await gateway.control(model, "parameters.get")
        if status != 200:
            return p2pfaas_error(Response(data, status_code=status, media_type="application/json"))
        stats = orjson.loads((await gateway.control(model, "stats"))[1])
        name = P2PFAAS_MODEL_NAMES.get(stats.get("algorithm", ""), stats.get("algorithm", ""))
        return Response(orjson.dumps({"name": name, "parameters": orjson.loads(data)}), media_type="application/json")

    @app.post("/learner/parameters", summary="Change hyper-parameters (unknown keys ignored): 200 or 500",
              dependencies=[bridge.changes_state_p2pfaas])
    async def set_parameters(request: Request) -> Response:
        try:
            sent = orjson.loads(await bridge.read_body(request))
        except orjson.JSONDecodeError as exc:
            return p2pfaas_error(error(400, f"parameters are not JSON: {exc}"))
        if isinstance(sent, dict) and isinstance(sent.get("parameters"), dict):
            sent = sent["parameters"]   # the {name, parameters} shape GET answers
        if not isinstance(sent, dict):
            return p2pfaas_error(error(400, "parameters must be a JSON object"))
        status, data = await gateway.control(model, "parameters.get")
        if status != 200:
            return p2pfaas_error(Response(data, status_code=status, media_type="application/json"))
        known = orjson.loads(data)
        status, data = await gateway.control(model, "parameters.set",
                                             orjson.dumps({k: v for k, v in sent.items() if k in known}))
        return Response(b"", status_code=200) if status == 200 else p2pfaas_error(
            Response(data, status_code=status, media_type="application/json"))

    @app.get("/learner/stats", summary="P2PFaaS's counters (+ p2pfaas's full stats under \"p2pfaas\")")
    async def stats() -> Response:
        status, data = await gateway.control(model, "stats")
        if status != 200:
            return p2pfaas_error(Response(data, status_code=status, media_type="application/json"))
        ours = orjson.loads(data)
        agent = ours.get("agent") or {}
        last = agent.get("eid_last_trained") or 0
        return Response(orjson.dumps({
            "inferences": agent.get("inferences", 0), "trained_items": agent.get("trained_items", ours["experiences"]),
            "epsilon": agent.get("epsilon"), "episodes": agent.get("windows", 0), "pending_entries": ours["pending"],
            "eid_max_seen": last, "eid_last_trained": last, "p2pfaas": ours,
        }), media_type="application/json")

    @app.get("/learner/weights", summary="{actions_map, states_map, table} of a Q-table model")
    async def weights() -> Response:
        status, data = await gateway.control(model, "weights.get")
        if status != 200:
            return p2pfaas_error(Response(data, status_code=status, media_type="application/json"))
        return Response(orjson.dumps(p2pfaas_weights(orjson.loads(data))), media_type="application/json")

    @app.get("/learner/reset", summary="Forget what the model learned: 200, empty", dependencies=[bridge.changes_state_p2pfaas])
    async def reset() -> Response:
        status, data = await gateway.control(model, "reset")
        return Response(b"", status_code=200) if status == 200 else p2pfaas_error(
            Response(data, status_code=status, media_type="application/json"))

    return app


def p2pfaas_error(response: Response) -> Response:
    """P2PFaaS's learner answered every refusal 500 (503 stays: nobody answered, try again)."""
    if response.status_code in (200, 503):
        return response
    response.status_code = 500
    return response


def p2pfaas_weights(weights: dict[str, Any]) -> dict[str, Any]:
    """A Q-table model as P2PFaaS shows it; other models keep ``LearnerWeights``."""
    if weights.get("algorithm") != "dsarsa":
        return weights
    import torch   # only here: reading a table needs torch's loader, the bridge otherwise does not

    payload = torch.load(io.BytesIO(base64.b64decode(weights["weights_b64"])), map_location="cpu", weights_only=True)
    state = payload.get("state", payload)
    keys, values = state["keys"], state["values"].tolist()
    return {
        "actions_map": {str(a): a for a in range(weights["n_actions"])},
        "states_map": {",".join(f"{v:g}" for v in key): row for row, key in enumerate(keys)},
        "table": values,
        "version": weights["version"],
    }
