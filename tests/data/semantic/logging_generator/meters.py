import time


class ProgressLogger:
    def __init__(self, every=50):
        self.every = every

    def logged(self, iterable, header=""):  # frequency: per-iteration
        start = time.time()
        for index, item in enumerate(iterable):
            yield item
            if index % self.every == 0:
                print(header, index, f"{time.time() - start:.1f}s")
