"""Unit tests with a mock network: what they pass says nothing of what the program runs."""
from search import run


class MockModel:
    def predict(self, board):  # frequency: once
        return [0.5, 0.5], 0.0


def test_run():
    run(MockModel(), None, 10)
