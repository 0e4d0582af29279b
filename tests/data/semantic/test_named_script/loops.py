def train(env, agent, episodes, steps):  # frequency: once
    for episode in range(episodes):
        state = env.reset()
        for step in range(steps):
            action = agent.get_action(state)
            state, reward, done, _ = env.step(action)
            if done:
                break
