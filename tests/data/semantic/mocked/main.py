"""Play or train, chosen by a flag: the `else:` of `if args.render:` is the training run, every time."""
from model import BoardNet
from search import run


class Trainer:
    def __init__(self, model):
        self.model = model

    def play(self, state):  # frequency: per-iteration
        return run(self.model, state, 100)


def main(args):
    trainer = Trainer(BoardNet())
    if args.render:
        show(trainer)
    else:
        for game in range(args.games):
            trainer.play(None)
