import copy


class Search:
    def __init__(self, evaluate, simulations):
        self._evaluate = evaluate
        self._simulations = simulations

    def _simulate(self, board):  # frequency: per-rollout-step
        priors, value = self._evaluate(board)
        return value

    def run(self, board):  # frequency: per-rollout-step
        for _ in range(self._simulations):
            self._simulate(copy.deepcopy(board))
        return 0


class Player:
    def __init__(self, evaluate, simulations=200):
        self.search = Search(evaluate, simulations)

    def choose(self, board):  # frequency: per-rollout-step
        return self.search.run(board)
