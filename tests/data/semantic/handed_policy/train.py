from mcts import MCTSPlayer
from net import PolicyValueNet


class TrainPipeline:
    def __init__(self, game):
        self.game = game
        self.policy_value_net = PolicyValueNet(15)
        self.mcts_player = MCTSPlayer(self.policy_value_net.policy_value_fn, n_playout=400)

    def collect_selfplay_data(self, n_games):
        for _ in range(n_games):
            board = self.game.new_board()
            while not board.game_end():
                move = self.mcts_player.get_action(board)
                board.do_move(move)


if __name__ == "__main__":
    TrainPipeline(game=None).collect_selfplay_data(10)
