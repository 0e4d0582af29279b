"""Split a self-play script's train time into playing (the functions named on the command line) and the rest.

    python benchmarks/e2e/phases.py SCRIPT FUNCTION [FUNCTION ...] [-- SCRIPT_ARGS]
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
        inner = getattr(module, name)

        def timed(*args, _inner=inner, _name=name, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = _inner(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            spent[_name] += time.perf_counter() - start
            return result
        setattr(module, name, timed)
    sys.argv = [path, *script_args]
    start = time.perf_counter()
    module.main()
    total = time.perf_counter() - start
    print(f"PHASES {path}: total {total:.2f}s " + " ".join(f"{n} {s:.2f}s" for n, s in spent.items())
          + f" rest {total - sum(spent.values()):.2f}s")


if __name__ == "__main__":
    main()
