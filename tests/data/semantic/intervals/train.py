import argparse

log_every = 1
save_every = 500

parser = argparse.ArgumentParser()
parser.add_argument("--policy-delay", type=int, default=2)
parser.add_argument("--eval-interval", type=int, default=1000)
args = parser.parse_args()


def report(loss):  # frequency: per-step
    print(loss.item())


def update_actor(batch):  # frequency: per-step
    return batch


def save(model):  # frequency: once
    return model


def evaluate(model):  # frequency: once
    return model


def train(model, loader, optimizer):
    for step, batch in enumerate(loader):  # hot: step-loop
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            report(loss)
        if step % args.policy_delay == 0:
            update_actor(batch)
        if step % save_every == 0:
            save(model)
        if step % args.eval_interval == 0:
            evaluate(model)
