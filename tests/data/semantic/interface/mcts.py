class MCTS:
    def __init__(self, game, nnet, sims):
        self.game, self.nnet, self.sims = game, nnet, sims

    def action_probs(self, board):  # frequency: per-rollout-step
        for _ in range(self.sims):
            self.search(board)
        return self.visits(board)

    def search(self, board):  # frequency: per-rollout-step
        if self.game.ended(board):
            return -1
        policy, value = self.nnet.predict(board)
        return -value

    def visits(self, board):
        return [1.0]
