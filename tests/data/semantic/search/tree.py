def tree_search(state, evaluate, simulations=50):  # frequency: per-rollout-step (play calls it every move)
    for _ in range(simulations):  # hot: rollout
        prior, value = evaluate(state)
    return prior
