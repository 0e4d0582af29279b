class Arena:
    """Plays one game between a player and itself; the player is whatever the caller hands over."""

    def self_play(self, player, board):  # frequency: per-iteration
        while not board.finished():
            move = player.choose(board)
            board.play(move)
        return board.winner()
