import ray
from ray.rllib.algorithms.ppo import PPOConfig
import policyport.rllib

ray.init(num_cpus=2, include_dashboard=False)
config = (PPOConfig().environment("CartPole-v1").training(train_batch_size_per_learner=1000)
          .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5))
algo = policyport.rllib.accelerate(config).build_algo()  # env runners now act through policyport
for i in range(3):
    result = algo.train()
    print(i, result["env_runners"]["episode_return_mean"], result["env_runners"]["rlmodule_inference_timer"])
algo.stop()
