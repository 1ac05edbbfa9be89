"""OpenFaaS's management routes, served from the node's own function registry and pools
(docs/compat.md): ``/system/functions`` (list, deploy, update, delete), ``/system/function/{fn}``,
``/system/scale-function/{fn}`` and P2PFaaS's ``/monitoring/scale-delay/{fn}``. Each is one
request/reply on ``faas.<node>.functions.*``; every one that changes something passes the
bridge's ``changes_state`` check.

A deploy body is OpenFaaS's (``service`` + ``image``, ``envVars``, ``labels``, ``annotations``,
``envProcess``), or P2PFaaS's wrapping of it (``{"openfaas_service": {...}}``); ``reference``
(``module:callable`` or ``image:<ref>``) is p2pfaas's way to deploy a Python function. A deploy
reaches every node (nodes/catalogue.py). What is not supported (``secrets``, ``limits``, ...) is
refused with 400 when it asks for something, never dropped in silence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from broker.control import control_request
from broker.http.invoke import error
from broker.subjects import FunctionsVerb, check_token

if TYPE_CHECKING:
    from broker.http_bridge import HttpBridge

IMAGE = "image:"


# OpenFaaS deploy keys this platform does not do: refused when they ask for something (faas-cli
# sends some of them empty), never dropped in silence (envVars were: the function ran without them)
NOT_SUPPORTED = {"secrets": "secrets are not supported yet: pass the value another way (envVars are not secret)",
                 "limits": "per-function limits are not supported yet", "requests": "resource requests are not supported",
                 "constraints": "placement constraints are not supported: every node runs every function",
                 "readOnlyRootFilesystem": "readOnlyRootFilesystem is not supported for image functions yet"}
IGNORED = {"namespace", "registryAuth", "network"}   # nothing to do here: no namespaces, no registry


def deployment(body: bytes) -> dict[str, Any] | Response:
    """The deployment (``service``, ``reference``, ``env_vars``, ``labels``, ``annotations``) of an
    OpenFaaS (or P2PFaaS) deploy body, or the 400 saying why not."""
    try:
        sent: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return error(400, f"the function is not valid JSON: {exc}")
    if isinstance(sent, dict) and isinstance(sent.get("openfaas_service"), dict):
        sent = sent["openfaas_service"]
    if not isinstance(sent, dict):
        return error(400, "the function must be a JSON object {service, image} or {service, reference}")
    service = sent.get("service") or sent.get("name")
    image = sent.get("image")
    reference = sent.get("reference") or (IMAGE + image if isinstance(image, str) else None)
    if not isinstance(service, str) or not isinstance(reference, str):
        return error(400, "a function needs service and image (an image) or reference (module:callable)")
    asked = [f"{key}: {why}" for key, why in NOT_SUPPORTED.items() if sent.get(key)]
    unknown = sorted(set(sent) - {"service", "name", "image", "reference", "envProcess", "envVars", "labels",
                                  "annotations", *NOT_SUPPORTED, *IGNORED})
    if asked or unknown:
        return error(400, "; ".join([*asked, *(f"{key}: unknown" for key in unknown)]))
    fields = {}
    for key, ours in (("envVars", "env_vars"), ("labels", "labels"), ("annotations", "annotations")):
        value = sent.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return error(400, f"{key} must be an object of strings")
        fields[ours] = value
    process = sent.get("envProcess")
    if process:   # OpenFaaS: the process the image's watchdog runs (its fprocess)
        if not isinstance(process, str) or not reference.startswith(IMAGE):
            return error(400, "envProcess is the process an image's watchdog runs: give it with image")
        fields["env_vars"] = {**fields["env_vars"], "fprocess": process}
    return {"service": service, "reference": reference, **fields}


def openfaas_router(bridge: "HttpBridge") -> APIRouter:
    router = APIRouter(tags=["OpenFaaS"])

    async def ask(verb: FunctionsVerb, body: dict[str, Any] | None = None, timeout_s: float | None = None) -> Response:
        subject = bridge.subjects.functions(bridge.node, verb)
        status, data = await control_request(bridge.nc, subject, orjson.dumps(body or {}),
                                             timeout_s or bridge.control_timeout_s)
        return Response(data, status_code=status, media_type="application/json")

    async def deploy(request: Request) -> Response:
        wanted = deployment(await bridge.read_body(request))
        if isinstance(wanted, Response):
            return wanted
        # importing a module and starting new workers takes seconds
        return await ask("deploy", wanted, timeout_s=max(bridge.control_timeout_s, 90.0))

    @router.get("/system/functions", summary="Functions of this node (OpenFaaS list)")
    async def list_functions() -> Response:
        return await ask("list")

    @router.post("/system/functions", summary="Deploy a function: {service, image} or {service, reference}",
                 dependencies=[bridge.changes_state])
    async def deploy_function(request: Request) -> Response:
        return await deploy(request)

    @router.put("/system/functions", summary="Update a function (deploy it anew)", dependencies=[bridge.changes_state])
    async def update_function(request: Request) -> Response:
        return await deploy(request)

    @router.delete("/system/functions", summary="Remove a deployed function: {functionName}",
                   dependencies=[bridge.changes_state])
    async def delete_function(request: Request) -> Response:
        try:
            sent = orjson.loads(await bridge.read_body(request))
            name = sent.get("functionName") or sent.get("service")
        except (orjson.JSONDecodeError, AttributeError):
            return error(400, "the body must be {\"functionName\": NAME}")
        if not isinstance(name, str):
            return error(400, "the body must be {\"functionName\": NAME}")
        return await ask("delete", {"service": check_token(name, "function")}, timeout_s=max(bridge.control_timeout_s, 90.0))

    @router.get("/system/function/{fn}", summary="One function (OpenFaaS)")
    async def get_function(fn: str) -> Response:
        response = await ask("list")
        if response.status_code != 200:
            return response
        found = [f for f in orjson.loads(response.body) if f["name"] == check_token(fn, "function")]
        return Response(orjson.dumps(found[0]), media_type="application/json") if found else error(
            404, f"no function {fn!r} on {bridge.node}")

    @router.post("/system/scale-function/{fn}", summary="Set the size of the function's pool: {replicas}",
                 dependencies=[bridge.changes_state])
    async def scale_function(fn: str, request: Request) -> Response:
        try:
            replicas = orjson.loads(await bridge.read_body(request)).get("replicas")
        except (orjson.JSONDecodeError, AttributeError):
            replicas = None
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            return error(400, "the body must be {\"replicas\": N}")
        return await ask("scale", {"service": check_token(fn, "function"), "replicas": replicas},
                         timeout_s=max(bridge.control_timeout_s, 30.0))

    @router.get("/monitoring/scale-delay/{fn}", summary="Seconds to add one worker to the function's pool (P2PFaaS)",
                dependencies=[bridge.changes_state])
    async def scale_delay(fn: str) -> Response:
        return await ask("scale_delay", {"service": check_token(fn, "function")}, timeout_s=150.0)

    return router
