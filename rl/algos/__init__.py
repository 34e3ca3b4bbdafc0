"""Algorithms: ES and PPO (and, later, the DQN family and DDPG/TD3)."""
