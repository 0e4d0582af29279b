"""A template method: the base class runs the episode loop, subclasses pick actions and learn."""


class BaseAgent:
    def run_episode(self, env):  # frequency: once
        state = env.reset()
        done = False
        while not done:  # hot: step-loop  (it learns on every environment step)
            action = self.pick_action(state)
            state, reward, done, info = env.step(action)
            if self.time_to_learn():
                self.learn()
