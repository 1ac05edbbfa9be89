"""Double DQN (van Hasselt et al., 2016) for discrete actions: an online and a target
Q-network, uniform replay, a linear epsilon schedule, Huber loss and gradient clipping."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .agent import (
    IncompatibleWeights,
    Progress,
    WeightsCodec,
    check_action,
    interact,
    linear_schedule,
    load_checkpoint,
    save_checkpoint,
)


@dataclass
class DQNConfig:
    learning_rate: float = 5e-4
    """Adam learning rate of the online network."""
    buffer_size: int = 50_000
    """Replay capacity in transitions; the oldest are overwritten first."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 1.0
    """Target-network update rate: 1.0 copies the online network, < 1 is a Polyak average."""
    target_network_frequency: int = 500
    """Transitions between two target-network updates."""
    batch_size: int = 64
    """Transitions per gradient step."""
    start_e: float = 1.0
    """Exploration epsilon at the first transition."""
    end_e: float = 0.05
    """Exploration epsilon once the schedule has run out."""
    exploration_steps: int = 10_000
    """Transitions over which epsilon falls from start_e to end_e (online learning has no horizon)."""
    learning_starts: int = 1_000
    """Transitions collected before the first gradient step."""
    train_frequency: int = 1
    """Transitions between two gradient steps."""
    max_grad_norm: float = 10.0
    """Gradients are clipped to this global L2 norm."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the Q-network's hidden layers (ReLU)."""


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: tuple[int, ...] = (64, 64)):
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, n_actions))
        self.network = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.network(obs)


@torch.inference_mode()
def greedy_action(q_network: QNetwork, obs: np.ndarray) -> int:
    """The action with the highest Q-value: what a served policy does."""
    x = torch.from_numpy(np.array(obs, dtype=np.float32).reshape(1, -1))
    return int(q_network(x).argmax(dim=1).item())


class ReplayBuffer:
    """A fixed-size ring of transitions in preallocated numpy arrays."""

    def __init__(self, capacity: int, obs_dim: int):
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.capacity, self.size, self.position = capacity, 0, 0

    def add(self, obs, action: int, reward: float, next_obs, done: bool) -> None:
        i = self.position
        self.obs[i], self.next_obs[i] = obs, next_obs
        self.actions[i], self.rewards[i], self.dones[i] = action, reward, float(done)
        self.position = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
        idx = rng.integers(0, self.size, size=batch_size)
        return tuple(
            torch.from_numpy(array[idx]) for array in (self.obs, self.actions, self.rewards, self.next_obs, self.dones)
        )


class DoubleDQN(WeightsCodec):
    """Double DQN agent; `update()` takes one transition, `learn()` drives a Gymnasium env."""

    algorithm = "dqn"
    config_class = DQNConfig

    def __init__(self, obs_dim: int, n_actions: int, config: DQNConfig | None = None, seed: int = 0):
        self.obs_dim, self.n_actions, self.seed = int(obs_dim), int(n_actions), seed
        self.config = config or DQNConfig()
        self.rng = np.random.default_rng(seed)
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching the global RNG
            torch.manual_seed(seed)
            self.q_network = QNetwork(self.obs_dim, self.n_actions, tuple(self.config.hidden_sizes))
        self.target_network = copy.deepcopy(self.q_network)
        self.optimizer = torch.optim.Adam(self.q_network.parameters(), lr=self.config.learning_rate)
        self.buffer = ReplayBuffer(self.config.buffer_size, self.obs_dim)
        self.global_step = 0

    @property
    def epsilon(self) -> float:
        c = self.config
        return linear_schedule(c.start_e, c.end_e, c.exploration_steps, self.global_step)

    def act(self, obs: np.ndarray, explore: bool = False) -> int:
        if explore and self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.n_actions))
        return greedy_action(self.q_network, obs)

    def update(self, obs, action, reward, next_obs, done, truncated: bool = False) -> dict:
        """Store one transition and train when due; `done` (terminated) does not bootstrap, truncated does."""
        c = self.config
        self.buffer.add(obs, check_action(self, action), float(reward), next_obs, bool(done))
        self.global_step += 1
        metrics: dict[str, float] = {"charts/epsilon": self.epsilon}
        if (
            self.global_step > c.learning_starts
            and self.buffer.size >= c.batch_size
            and self.global_step % c.train_frequency == 0
        ):
            metrics.update(self._train_step())
        if self.global_step % c.target_network_frequency == 0:
            for target, online in zip(self.target_network.parameters(), self.q_network.parameters()):
                target.data.copy_(c.tau * online.data + (1.0 - c.tau) * target.data)
        return metrics

    def _train_step(self) -> dict[str, float]:
        c = self.config
        obs, actions, rewards, next_obs, dones = self.buffer.sample(c.batch_size, self.rng)
        with torch.no_grad():
            # Double DQN: the online network picks the next action, the target network values it.
            next_actions = self.q_network(next_obs).argmax(dim=1, keepdim=True)
            next_q = self.target_network(next_obs).gather(1, next_actions).squeeze(1)
            td_target = rewards + c.gamma * next_q * (1.0 - dones)
        q_values = self.q_network(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q_values, td_target)
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q_network.parameters(), c.max_grad_norm)
        self.optimizer.step()
        return {"losses/td_loss": loss.item(), "losses/q_values": q_values.mean().item()}

    def learn(self, env: gym.Env, total_steps: int, seed: int, progress: Progress | None = None) -> dict:
        self.rng = np.random.default_rng(seed)
        return interact(self, env, total_steps, seed, progress)

    # -- weights and checkpoints ------------------------------------------------------

    def weights_state(self) -> dict:
        """What acting needs (get_weights() serialises it, portable files store it)."""
        return {"q_network": self.q_network.state_dict(), "global_step": self.global_step}

    def load_weights_state(self, state: dict) -> None:
        try:
            self.q_network.load_state_dict(state["q_network"])
        except RuntimeError as exc:  # other hidden sizes
            raise IncompatibleWeights(f"dqn: {exc}") from exc
        self.target_network.load_state_dict(state["q_network"])
        self.global_step = int(state["global_step"])

    def save(self, path: str | Path) -> None:
        """Networks, optimizer and step counter; the replay buffer is not saved."""
        save_checkpoint(path, self, {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
        })

    @classmethod
    def load(cls, path: str | Path) -> DoubleDQN:
        agent, state = load_checkpoint(path, cls)
        agent.q_network.load_state_dict(state["q_network"])
        agent.target_network.load_state_dict(state["target_network"])
        agent.optimizer.load_state_dict(state["optimizer"])
        agent.global_step = int(state["global_step"])
        return agent
