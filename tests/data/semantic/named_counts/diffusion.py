import torch


class Diffusion:
    def __init__(self, steps):
        self.num_timesteps = steps

    def denoise(self, model, x, t):  # frequency: per-rollout-step
        return x - 0.1 * model(x, t)

    def sample(self, model, shape, progress=False):
        x = torch.randn(*shape, device="cuda")
        indices = list(range(self.num_timesteps))[::-1]  # a count, reversed: each pass is one denoising step
        if progress:
            indices = tqdm(indices)
        for i in indices:  # hot: rollout
            t = torch.full((shape[0],), i, device="cuda")
            with torch.no_grad():
                x = self.denoise(model, x, t)
        return x

    def evaluate(self, model, batches):
        for batch in batches:  # hot: none
            self.denoise(model, batch, torch.zeros(len(batch), device="cuda"))


def main(model):
    diffusion = Diffusion(1000)
    for _ in range(4):
        diffusion.sample(model, (8, 3, 32, 32))
