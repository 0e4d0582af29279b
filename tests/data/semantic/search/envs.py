import torch


class VecTorch(VecEnvWrapper):  # a wrapper class named for what it wraps: its base says it is an environment
    def step_wait(self):  # frequency: per-rollout-step
        obs, reward, done, info = self.venv.step_wait()
        return torch.from_numpy(obs).to("cuda"), reward, done, info
