def tree_search(state, evaluate, simulations=50):  # frequency: once
    for _ in range(simulations):  # hot: rollout
        prior, value = evaluate(state)
    return prior
