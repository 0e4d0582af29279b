"""The learning cycle: self-play, then a loop of training steps through a model object named like a network
(`muzero_model.train(...)`): that loop is a training-step loop, not a rollout around a sampler."""
from model import Muzero


def learning_cycle(replay_buffer, iterations, updates):  # frequency: once
    muzero_model = Muzero(64, 5, "cuda")
    for iteration in range(iterations):
        replay_buffer.save_game(replay_buffer.play())
        for update in range(updates):
            muzero_model.train(replay_buffer.sample_batch())


if __name__ == "__main__":
    learning_cycle(None, 10, 100)
