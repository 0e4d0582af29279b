def log_step(writer, loss, accuracy, step):  # device-params: loss
    writer.add_scalar("loss", loss, step)
    writer.add_scalar("accuracy", accuracy, step)


def log_value(writer, name, value, step):  # device-params: none
    writer.add_scalar(name, value, step)


def summarise(logits, labels):  # device-params: none (a network output: where the network runs is not known)
    return (logits.argmax(1) == labels).float().mean()
