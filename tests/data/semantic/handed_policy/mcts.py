import copy


class MCTS:
    def __init__(self, policy_value_fn, n_playout):
        self._policy = policy_value_fn
        self._n_playout = n_playout

    def _playout(self, state):  # frequency: per-rollout-step
        probs, value = self._policy(state)
        return value

    def get_move(self, state):
        for _ in range(self._n_playout):
            self._playout(copy.deepcopy(state))
        return 0


class MCTSPlayer:
    def __init__(self, policy_value_function, n_playout=400):
        self.mcts = MCTS(policy_value_function, n_playout)

    def get_action(self, board):
        return self.mcts.get_move(board)
