class NeuralNet:
    """The interface every game's network wrapper implements."""

    def predict(self, board):
        raise NotImplementedError
