"""Farm autoscaling; importing the package only registers ``p2pfaas/FarmScaling-v0``."""

import gymnasium

ENV_ID = "p2pfaas/FarmScaling-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="controller.env:FarmScalingEnv")

__all__ = ["ENV_ID"]
