from mcts import MCTS


def self_play(game, nnet, episodes):
    for _ in range(episodes):
        board = game.initial()
        tree = MCTS(game, nnet, 25)
        while not game.ended(board):
            probs = tree.action_probs(board)
            board = game.next_state(board, probs)
