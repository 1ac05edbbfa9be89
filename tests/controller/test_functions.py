"""Each function's own autoscaling (controller/functions.py): the functions of the catalogue with
a pool of their own are scaled by their deployment's policy on the node that runs them; a
policy the controller does not know is said, and nothing is scaled by it."""

from __future__ import annotations

import asyncio
import logging

import orjson

from broker.codec import encode
from broker.control import control_request
from broker.messages import FunctionDeployment, FunctionScaling
from broker.subjects import Subjects
from controller.functions import FunctionScaler
from controller.scenario import load_scenario
from support import wait_until


async def deploy(nc, prefix, **fields) -> None:
    status, data = await control_request(nc, Subjects(prefix).functions("n1", "deploy"),
                                         encode(FunctionDeployment(**fields)), 60)
    assert status == 200, data


async def test_a_functions_pool_is_scaled_by_its_policy_and_an_unknown_one_is_said(node_factory, nc, prefix, faas,
                                                                                  caplog):
    caplog.set_level(logging.INFO, logger="controller.functions")
    async with node_factory(k=1, runtime="inprocess", telemetry_period_s=0.5) as node:
        await deploy(nc, prefix, service="slow", reference="functions.builtins:sleep",
                     scaling=FunctionScaling(min=1, max=6, policy="kpa"))
        await deploy(nc, prefix, service="odd", reference="functions.builtins:echo",
                     scaling=FunctionScaling(min=1, max=2, policy="no-such-policy"))
        scaler = await FunctionScaler(nc, load_scenario("bursty"), prefix=prefix).start()
        try:
            await wait_until(lambda: ("n1", "slow") in scaler.controllers, timeout_s=20)
            assert scaler.controllers[("n1", "slow")].policy_name == "kpa"
            # 12 calls of 1 s at once on one worker: KPA's panic window wants more workers at once
            calls = [asyncio.create_task(faas.invoke("n1", "slow", b"1", timeout_s=60)) for _ in range(12)]
            await wait_until(lambda: node.pools["slow"].target >= 3, timeout_s=20)
            answers = await asyncio.gather(*calls)
            assert all(a.status == 200 for a in answers)
            assert node.pools["odd"].target == 1 and node.pool.target == 1   # the others untouched
            await wait_until(lambda: "odd" in scaler.refused, timeout_s=20)
            assert "unknown policy 'no-such-policy'" in scaler.refused["odd"] and ("n1", "odd") not in scaler.controllers
            assert "its policy 'no-such-policy' is not run" in caplog.text
            # removed: its controller goes
            status, _ = await control_request(nc, Subjects(prefix).functions("n1", "delete"),
                                              orjson.dumps({"service": "slow"}), 60)
            assert status == 200
            await wait_until(lambda: ("n1", "slow") not in scaler.controllers, timeout_s=20)
        finally:
            await scaler.stop()
