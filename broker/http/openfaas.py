"""OpenFaaS's management routes (``/system/*``) and P2PFaaS's ``/monitoring/scale-delay/{fn}``, each one
request/reply on ``faas.<node>.functions.*`` (docs/compat.md)."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from broker.control import control_request
from broker.deploy_body import DeployBodyError, read_deployment
from broker.http.invoke import error
from broker.subjects import FunctionsVerb, check_token

if TYPE_CHECKING:
    from broker.http.bridge import Bridge


def deployment(body: bytes) -> dict[str, Any] | Response:
    """The deployment of an OpenFaaS (or P2PFaaS) deploy body, or the 400 saying why not."""
    try:
        return read_deployment(orjson.loads(body)).model_dump(exclude_defaults=True)
    except orjson.JSONDecodeError as exc:
        return error(400, f"the function is not valid JSON: {exc}")
    except DeployBodyError as exc:
        return error(400, str(exc))


def secret_change(body: bytes, mode: str) -> dict[str, Any] | Response:
    """OpenFaaS's secret body ``{name, value}`` (or ``rawValue``, base64) as a SecretChange."""
    try:
        sent = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return error(400, f"the secret is not valid JSON: {exc}")
    if not isinstance(sent, dict) or not isinstance(sent.get("name"), str):
        return error(400, "the body must be {\"name\": NAME, \"value\": VALUE}")
    change: dict[str, Any] = {"name": sent["name"], "mode": mode}
    if mode != "delete":
        value = sent.get("value")
        if value is None and isinstance(sent.get("rawValue"), str):
            try:
                value = base64.b64decode(sent["rawValue"], validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return error(400, "rawValue must be base64 of UTF-8 text")
        if not isinstance(value, str) or not value:
            return error(400, f"secret {sent['name']!r}: value (or rawValue) is missing")
        change["value"] = value
    else:
        change["mode"] = "set"
    return change


def openfaas_router(bridge: "Bridge") -> APIRouter:
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

    @router.get("/system/secrets", summary="The deployment's secrets (names only)", dependencies=[bridge.changes_state])
    async def list_secrets() -> Response:
        return await ask("secrets_list")

    async def change_secret(request: Request, verb: FunctionsVerb, mode: str) -> Response:
        change = secret_change(await bridge.read_body(request), mode)
        if isinstance(change, Response):
            return change
        return await ask(verb, change)

    @router.post("/system/secrets", summary="Create a secret: {name, value}", dependencies=[bridge.changes_state])
    async def create_secret(request: Request) -> Response:
        return await change_secret(request, "secrets_set", "create")

    @router.put("/system/secrets", summary="Update a secret: {name, value}", dependencies=[bridge.changes_state])
    async def update_secret(request: Request) -> Response:
        return await change_secret(request, "secrets_set", "update")

    @router.delete("/system/secrets", summary="Remove a secret: {name}", dependencies=[bridge.changes_state])
    async def delete_secret(request: Request) -> Response:
        return await change_secret(request, "secrets_delete", "delete")

    @router.get("/monitoring/scale-delay/{fn}", summary="Seconds to add one worker to the function's pool (P2PFaaS)",
                dependencies=[bridge.changes_state])
    async def scale_delay(fn: str) -> Response:
        return await ask("scale_delay", {"service": check_token(fn, "function")}, timeout_s=150.0)

    return router
