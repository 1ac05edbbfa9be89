"""Farm autoscaling: scenarios, simulator, Gymnasium env, baselines, evaluation, live controller.

Importing the package only registers ``p2pfaas/FarmScaling-v0``; the modules load on use.
"""

import gymnasium

ENV_ID = "p2pfaas/FarmScaling-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="controller.env:FarmScalingEnv")

__all__ = ["ENV_ID"]
