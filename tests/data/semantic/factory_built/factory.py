from schedule import RespacedSchedule


def build_schedule(steps=1000):  # frequency: once
    return RespacedSchedule(steps)
