"""The RL algorithms, in one place: the learner service and the controller both import
them from here. Every agent follows `Agent` (see docs/agents.md)."""

from .agent import Agent, IncompatibleWeights
from .differential_sarsa import DifferentialSarsa, DifferentialSarsaConfig
from .dqn import DoubleDQN, DQNConfig, QNetwork, greedy_action
from .policy_gradient import PPO, ActorCritic, PPOConfig
from .sarsa import Discretiser, SarsaConfig, SarsaLambda

AGENTS: dict[str, type] = {
    "dqn": DoubleDQN,
    "pg": PPO,
    "sarsa": SarsaLambda,
    "dsarsa": DifferentialSarsa,
}

__all__ = [
    "AGENTS",
    "Agent",
    "ActorCritic",
    "DQNConfig",
    "DifferentialSarsa",
    "DifferentialSarsaConfig",
    "Discretiser",
    "DoubleDQN",
    "IncompatibleWeights",
    "PPO",
    "PPOConfig",
    "QNetwork",
    "SarsaConfig",
    "SarsaLambda",
    "greedy_action",
]
