import sys
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
import policyport.sb3

model = PPO.load(sys.argv[1])  # e.g. tests/fixtures/sb3/ppo_cartpole/model.zip
predictor = policyport.sb3.Predictor(model)  # compiled in process; predict(obs, state, episode_start, deterministic)
actions, _ = predictor.predict(gym.make("CartPole-v1").reset(seed=0)[0], deterministic=True)
mean, std = evaluate_policy(predictor, gym.make("CartPole-v1"), n_eval_episodes=5)
print(f"action {actions}, mean return {mean:.1f} +- {std:.1f}")
