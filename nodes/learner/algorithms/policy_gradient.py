"""PPO with a clipped surrogate objective and GAE (Schulman et al., 2017) for discrete
actions: a small MLP actor-critic trained on fixed-length rollouts of transitions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from .agent import (
    IncompatibleWeights,
    Progress,
    WeightsCodec,
    check_action,
    interact,
    load_checkpoint,
    save_checkpoint,
)


@dataclass
class PPOConfig:
    learning_rate: float = 2.5e-4
    """Adam learning rate (actor and critic share one optimizer)."""
    num_steps: int = 256
    """Transitions per rollout; the agent trains each time a rollout is complete."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """Lambda of generalised advantage estimation."""
    num_minibatches: int = 4
    """Minibatches each rollout is split into."""
    update_epochs: int = 4
    """Passes over a rollout."""
    clip_coef: float = 0.2
    """Surrogate clipping: the probability ratio is kept within 1 +- clip_coef."""
    clip_vloss: bool = True
    """Clip the value loss around the rollout's value estimates as well."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus (keeps exploring)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float = 0.5
    """Gradients are clipped to this global L2 norm."""
    target_kl: float | None = None
    """Stop a rollout's epochs early once the approximate KL exceeds this (None: never)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers (tanh) of both the actor and the critic."""


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(inputs: int, hidden_sizes: tuple[int, ...], outputs: int, last_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for hidden in hidden_sizes:
        layers += [layer_init(nn.Linear(inputs, hidden)), nn.Tanh()]
        inputs = hidden
    layers.append(layer_init(nn.Linear(inputs, outputs), std=last_std))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor (action logits) and critic (state value) MLPs."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.actor = mlp(obs_dim, hidden_sizes, n_actions, last_std=0.01)
        self.critic = mlp(obs_dim, hidden_sizes, 1, last_std=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability of `actions`, policy entropy and state value."""
        log_probs = torch.log_softmax(self.actor(obs), dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(1, actions.unsqueeze(1)).squeeze(1), entropy, self.value(obs)


class PPO(WeightsCodec):
    """PPO agent; `update()` buffers transitions and trains when a rollout is complete."""

    algorithm = "pg"
    config_class = PPOConfig

    def __init__(self, obs_dim: int, n_actions: int, config: PPOConfig | None = None, seed: int = 0):
        self.obs_dim, self.n_actions, self.seed = int(obs_dim), int(n_actions), seed
        self.config = config or PPOConfig()
        self.rng = np.random.default_rng(seed)  # action sampling and minibatch order
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching the global RNG
            torch.manual_seed(seed)
            self.network = ActorCritic(self.obs_dim, self.n_actions, tuple(self.config.hidden_sizes))
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=self.config.learning_rate, eps=1e-5)
        self.rollout: list[tuple] = []
        self.global_step = 0

    @torch.inference_mode()
    def act(self, obs: np.ndarray, explore: bool = False) -> int:
        """explore=True samples from the policy; False takes its most probable action."""
        logits = self.network.actor(torch.from_numpy(np.array(obs, dtype=np.float32).reshape(1, -1)))
        if explore:  # inverse-CDF sampling with the agent's own seeded generator
            cdf = np.cumsum(torch.softmax(logits[0].double(), dim=-1).numpy())
            return int(min(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"), self.n_actions - 1))
        return int(logits.argmax(dim=1).item())

    def update(self, obs, action, reward, next_obs, done, truncated: bool = False) -> dict:
        """Buffer one transition, train once the rollout holds num_steps; truncated still bootstraps."""
        self.rollout.append((
            np.asarray(obs, dtype=np.float32).reshape(self.obs_dim), check_action(self, action), float(reward),
            np.asarray(next_obs, dtype=np.float32).reshape(self.obs_dim), bool(done), bool(done or truncated),
        ))
        self.global_step += 1
        return self._train_rollout() if len(self.rollout) >= self.config.num_steps else {}

    def _advantages(self, obs, rewards, next_obs, terminated, ended) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over the rollout; the lambda-chain carries on only where the next transition starts
        where this one ended (a broker's transitions may come from interleaved episodes)."""
        c, n = self.config, len(rewards)
        with torch.no_grad():
            values, next_values = self.network.value(obs), self.network.value(next_obs)
        v, next_v, r, term = values.tolist(), next_values.tolist(), rewards.tolist(), terminated.tolist()
        obs_np, next_np = obs.numpy(), next_obs.numpy()
        continues = [not ended[t] and np.array_equal(next_np[t], obs_np[t + 1]) for t in range(n - 1)] + [False]
        advantages = [0.0] * n
        last = 0.0
        for t in reversed(range(n)):  # plain floats: a python loop over tensors is ~10x slower
            delta = r[t] + c.gamma * next_v[t] * (1.0 - term[t]) - v[t]
            last = delta + c.gamma * c.gae_lambda * continues[t] * last
            advantages[t] = last
        return torch.tensor(advantages), values

    def _train_rollout(self) -> dict[str, float]:
        c = self.config
        columns = list(zip(*self.rollout))
        self.rollout.clear()
        obs, next_obs = torch.from_numpy(np.stack(columns[0])), torch.from_numpy(np.stack(columns[3]))
        actions = torch.tensor(columns[1], dtype=torch.int64)
        rewards = torch.tensor(columns[2], dtype=torch.float32)
        terminated = torch.tensor(columns[4], dtype=torch.float32)
        advantages, values = self._advantages(obs, rewards, next_obs, terminated, columns[5])
        returns = advantages + values
        with torch.no_grad():  # the policy has not changed since the rollout began
            old_logprobs, _, _ = self.network.evaluate(obs, actions)

        n = len(actions)
        minibatch = max(1, n // c.num_minibatches)
        clipfracs: list[float] = []
        for _ in range(c.update_epochs):
            order = torch.from_numpy(self.rng.permutation(n))
            for start in range(0, n, minibatch):
                mb = order[start:start + minibatch]
                logprobs, entropy, new_values = self.network.evaluate(obs[mb], actions[mb])
                log_ratio = logprobs - old_logprobs[mb]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > c.clip_coef).float().mean().item())
                mb_adv = advantages[mb]
                if c.norm_adv and len(mb) > 1:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)).mean()
                if c.clip_vloss:
                    clipped = values[mb] + (new_values - values[mb]).clamp(-c.clip_coef, c.clip_coef)
                    v_loss = 0.5 * torch.max((new_values - returns[mb]) ** 2, (clipped - returns[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((new_values - returns[mb]) ** 2).mean()
                entropy_loss = entropy.mean()
                loss = pg_loss - c.ent_coef * entropy_loss + c.vf_coef * v_loss
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.network.parameters(), c.max_grad_norm)
                self.optimizer.step()
            if c.target_kl is not None and approx_kl > c.target_kl:
                break

        variance = returns.var()
        explained = float("nan") if variance == 0 else float(1 - (returns - values).var() / variance)
        return {
            "losses/policy_loss": pg_loss.item(),
            "losses/value_loss": v_loss.item(),
            "losses/entropy": entropy_loss.item(),
            "losses/approx_kl": approx_kl.item(),
            "losses/clipfrac": float(np.mean(clipfracs)),
            "losses/explained_variance": explained,
        }

    def learn(self, env: gym.Env, total_steps: int, seed: int, progress: Progress | None = None) -> dict:
        self.rng = np.random.default_rng(seed)
        self.rollout.clear()
        return interact(self, env, total_steps, seed, progress)

    # -- weights and checkpoints ------------------------------------------------------

    def weights_state(self) -> dict:
        """What acting needs (get_weights() serialises it, portable files store it)."""
        return {"network": self.network.state_dict()}

    def load_weights_state(self, state: dict) -> None:
        try:
            self.network.load_state_dict(state["network"])
        except RuntimeError as exc:  # other hidden sizes
            raise IncompatibleWeights(f"pg: {exc}") from exc

    def save(self, path: str | Path) -> None:
        """Network, optimizer and step counter; a partial rollout is not saved."""
        save_checkpoint(path, self, {
            "network": self.network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
        })

    @classmethod
    def load(cls, path: str | Path) -> PPO:
        agent, state = load_checkpoint(path, cls)
        agent.network.load_state_dict(state["network"])
        agent.optimizer.load_state_dict(state["optimizer"])
        agent.global_step = int(state["global_step"])
        return agent
