"""A tree search whose network comes in as a parameter: the program passes `self.model`, the tests a mock."""


def run(model, state, simulations):  # frequency: per-iteration
    for _ in range(simulations):  # hot: rollout
        priors, value = model.predict(state)
        state = state.expand(priors, value)
    return state
