"""Split a script's train time into the functions or methods named on the command line and the rest.

    python benchmarks/e2e/phases.py SCRIPT NAME [NAME ...] [-- SCRIPT_ARGS]

A NAME is a module-level function (`play_game`) or a method (`PPO.collect`); each call is timed between two
device synchronisations, so queued GPU work is charged to the phase that queued it.
"""
import importlib.util
import sys
import time

import torch


def main():
    argv = sys.argv[1:]
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    path, names = argv[0], argv[1:]
    spec = importlib.util.spec_from_file_location("script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    spent = {name: 0.0 for name in names}
    for name in names:
        owner_name, _, attribute = name.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        inner = getattr(owner, attribute)

        def timed(*args, _inner=inner, _name=name, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = _inner(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            spent[_name] += time.perf_counter() - start
            return result
        setattr(owner, attribute, timed)
    sys.argv = [path, *script_args]
    start = time.perf_counter()
    module.main()
    total = time.perf_counter() - start
    print(f"PHASES {path}: total {total:.2f}s " + " ".join(f"{n} {s:.2f}s" for n, s in spent.items())
          + f" rest {total - sum(spent.values()):.2f}s")


if __name__ == "__main__":
    main()
