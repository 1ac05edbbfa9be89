"""P2PFaaS's discovery API on its own port (19000; docs/compat.md), each route a request/reply on
``faas.<node>.discovery.*`` (``.peers`` for a plain list)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from broker import headers as H
from broker.answers import VERSION
from broker.control import control_request
from broker.http.control import known_keys
from broker.http.invoke import port_app
from broker.messages import DiscoveryConfiguration

if TYPE_CHECKING:
    from broker.http.bridge import Bridge

def discovery_app(bridge: "Bridge") -> FastAPI:
    app = port_app("p2pfaas discovery API (P2PFaaS-compatible)", f"Welcome to the p2pfaas discovery service v{VERSION}!")
    node, subjects = bridge.node, bridge.subjects

    async def ask(subject: str, body: bytes = b"") -> tuple[int, bytes]:
        return await control_request(bridge.nc, subject, body, bridge.control_timeout_s)

    @app.get("/list", summary="Alive peers; a polling P2PFaaS machine joins them")
    async def peer_list(request: Request) -> Response:
        announced = request.headers.get(H.MACHINE_IP)
        if request.headers.get(H.USER_AGENT) == H.USER_AGENT_MACHINE and announced:
            await bridge.authorize_p2pfaas_change(request)   # a machine joining changes the node's peers
            status, data = await ask(subjects.discovery(node, "register"), orjson.dumps({
                "ip": announced, "name": request.headers.get(H.MACHINE_NAME, ""),
                "group_name": request.headers.get(H.MACHINE_GROUP, "")}))
            if status != 200:   # not an IP: P2PFaaS ignores such a machine and answers the list
                status, data = await ask(subjects.peers(node))
        else:
            status, data = await ask(subjects.peers(node))
        if status != 200:
            return Response(data, status_code=status, media_type="application/json")
        _, me = await ask(subjects.discovery(node, "config.get"))
        config = DiscoveryConfiguration.model_validate_json(me)
        return Response(data, media_type="application/json", headers={
            H.MACHINE_IP: config.machine_ip, H.MACHINE_NAME: config.machine_id, H.MACHINE_GROUP: config.machine_group_name})

    @app.get("/reset", summary="Forget every peer (p2pfaas peers come back with their next heartbeat)",
             dependencies=[bridge.changes_state_p2pfaas])
    async def reset() -> Response:
        status, data = await ask(subjects.discovery(node, "reset"))
        return Response(b"", status_code=200) if status == 200 else Response(data, status_code=status,
                                                                             media_type="application/json")

    @app.get("/configuration", summary="{machine_ip, machine_id, machine_group_name, init_servers}")
    async def get_configuration() -> Response:
        status, data = await ask(subjects.discovery(node, "config.get"))
        if status == 200 and not orjson.loads(data)["machine_ip"]:   # P2PFaaS: 500 {code 100} until it has an IP
            return Response(orjson.dumps({"code": 100, "message": "Configuration not ready"}), status_code=500,
                            media_type="application/json")
        return Response(data, status_code=status, media_type="application/json")

    @app.post("/configuration", summary="Change the group and init servers (keys not sent keep their value)",
              dependencies=[bridge.changes_state_p2pfaas])
    async def set_configuration(request: Request) -> Response:
        status, data = await ask(subjects.discovery(node, "config.set"),
                                 known_keys(await bridge.read_body(request), DiscoveryConfiguration))
        return Response(data, status_code=status, media_type="application/json")

    return app
