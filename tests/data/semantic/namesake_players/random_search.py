import random


class Player:
    """A baseline with the same class name as the search player: only evaluation games use it."""

    def choose(self, board):  # frequency: once
        return random.choice(board.legal_moves())
