"""Vanilla policy gradient (REINFORCE with a mean baseline) written with rl.build_policy."""
import numpy as np
import torch
from torch import nn

import rl


def model_fn(obs_space, action_space, config):
    return nn.Sequential(nn.Linear(obs_space.shape[0], 64), nn.Tanh(), nn.Linear(64, action_space.n))


def returns_to_go(policy, episode):
    returns, running = np.zeros_like(episode["rewards"]), 0.0
    for t in reversed(range(len(returns))):
        running = episode["rewards"][t] + policy.config["gamma"] * running
        returns[t] = running
    return {**episode, "returns": returns}


def pg_loss(model, batch, config):
    advantages = (batch["returns"] - batch["returns"].mean()) / (batch["returns"].std() + 1e-8)
    logp = torch.distributions.Categorical(logits=model(batch["obs"])).log_prob(batch["actions"])
    return -(logp * advantages).mean()


VanillaPG = rl.build_policy("VanillaPG", model_fn, pg_loss, postprocess_fn=returns_to_go,
                            defaults={"lr": 0.01, "train_batch_size": 2000})

if __name__ == "__main__":
    env = rl.make_vector_env("CartPole-v1", 4, seed=0)
    policy = VanillaPG(env.observation_space, env.action_space, seed=0)
    evaluate = rl.hooks.Evaluate("CartPole-v1", every_steps=10_000)
    state = rl.run(policy, env, rl.AfterSteps(200_000) | rl.RewardReached(195), [evaluate])
    print(f"evaluation mean {state.evaluations[-1][1]:.1f} after {state.env_steps} env steps")
