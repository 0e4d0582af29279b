"""Names that mean something to a training program, as predicates over dotted call names.

Both the per-file pre-pass (libcst) and the program call graph (`ast`) ask these, so a loop is a training-step
loop, a rollout loop or neither by the same test wherever it is seen.
"""

from __future__ import annotations

import re
from typing import Iterable

OPTIMIZER_NAME = re.compile(r"optim|^opt(_|\d|$)|_opt$|^opt[A-Z]", re.I)
# receivers of `.step(...)` that are host-side simulators or games: one call per environment step / move
ENV_RECEIVER = re.compile(r"env|game|board|(^|[._])tasks?$", re.I)  # `self._task.step(a)`: an environment called a task
ENV_METHODS = frozenset({"step", "play", "make_move", "play_move", "do_move", "execute_move", "apply_action",
                         "getNextState", "get_next_state", "next_state", "act"})  # (`venv.act(ac)`: gym3's step)
# classes whose step methods an environment step runs: `class VecPyTorch(VecEnvWrapper)`, `class Game`
ENV_CLASS = re.compile(r"env|game|wrapper", re.I)
ENV_STEP_METHODS = frozenset({"step", "step_wait", "step_async", "observation", "reward", "action"})
MODEL_NAME = re.compile(r"^(model|net|network|policy|actor|critic|agent|encoder|decoder|generator|discriminator|"
                        r"classifier|backbone|q_net|qnet|q_network|module|ddp_model|raw_model)$|model$|net$", re.I)
# methods through which a network is evaluated (MuZero's inference calls, Keras-style predict)
NETWORK_METHODS = frozenset({"forward", "predict", "inference", "initial_inference", "recurrent_inference"})
LOADER_TEXT = re.compile(r"loader|(^|_)dl($|_)|dataloader", re.I)
# `if` tests that throttle what they guard to every N steps, the end of an episode or a debug switch
THROTTLE_NAME = re.compile(r"interval|freq|every|period|log|print|verbose|debug|save|ckpt|checkpoint|eval|"
                           r"done|terminal|finished|is_over|game_over|display|render|plot|report", re.I)
# functions never worth calling hot: file and screen output (a logging helper called every step still syncs
# every step, so `log_*` is not among them)
OUTPUT_FUNCTION = re.compile(r"^_?(save|load|plot|render|visuali[sz]e|draw|dump|checkpoint|test_)", re.I)
# iterables of a loop that repeats a step rather than walking a collection
# torch functions that make a new tensor and take `device=` (a CPU tensor unless given one)
TORCH_FACTORIES = frozenset({"zeros", "ones", "full", "empty", "eye", "arange", "linspace", "logspace", "rand", "randn",
                             "randint", "randperm", "normal"})
# a loop that tries something again on failure (`while retries:`, `for attempt in range(3)`): not a rollout
# tensor methods whose result is a tensor where the receiver is (reductions, casts, reshapes, elementwise math)
TENSOR_PRESERVING_METHODS = frozenset({
    "abs", "add", "all", "amax", "amin", "any", "argmax", "argmin", "bfloat16", "bool", "clamp", "clone",
    "contiguous", "count_nonzero", "cuda", "cumsum", "detach", "div", "double", "eq", "exp", "expand", "expand_as",
    "flatten", "float", "gather", "ge", "gt", "half", "int", "isfinite", "isinf", "isnan", "le", "log",
    "log_softmax", "logical_not", "long", "lt", "masked_fill", "max", "mean", "median", "min", "mul", "nanmean",
    "nansum", "ne", "neg", "norm", "permute", "pow", "prod", "repeat", "reshape", "sigmoid", "softmax", "sqrt",
    "square", "squeeze", "std", "sub", "sum", "t", "tanh", "to", "transpose", "type_as", "unsqueeze", "var",
    "view"})
INDEX_NAME = re.compile(r"idx|index|indices|perm|(^|_)ids?$", re.I)  # integer indexes, not bool masks
RETRY_NAME = re.compile(r"retr(y|ies)|attempt|tries", re.I)
# methods handing a DataLoader to a framework that delivers its batches on the device (Fabric, Accelerate)
DEVICE_LOADER_WRAPPERS = frozenset({"setup_dataloaders", "prepare", "prepare_data_loader"})
COUNTING_ITERABLES = frozenset({"range", "trange", "count", "repeat", "xrange"})
# wrappers that keep a counting loop counting (`tqdm(reversed(range(T)))`: a sampler's T steps)
COUNT_KEEPING_WRAPPERS = frozenset({"tqdm", "enumerate", "reversed", "list"})
# episode-end flags (`done`, `dones`, `terminated`, `is_terminal`): a branch on them runs once per episode, and as an
# index into a tensor they can only be a bool mask (0/1 integers would pick rows 0 and 1, floats raise)
EPISODE_END_NAME = re.compile(r"^(?:is_)?(?:dones?|terminals?|terminated|truncated|game_over|episode_over)$", re.I)
EVAL_FUNCTION = re.compile(r"^_?(eval|evaluate|test|valid|validate|validation|val)(_|$)", re.I)


def last_part(dotted: str | None) -> str:
    return (dotted or "").rsplit(".", 1)[-1]


def receiver(dotted: str | None) -> str:
    """`self.env.step` -> `env`; `step` -> ``."""
    parts = (dotted or "").split(".")
    return parts[-2] if len(parts) > 1 else ""


def is_training_step_call(dotted: str | None) -> bool:
    """`loss.backward()`, `torch.autograd.backward(...)`, `optimizer.step()`, `scaler.step(optimizer)`."""
    name = last_part(dotted)
    if name == "backward":
        return True
    if name == "step" and receiver(dotted):
        owner = receiver(dotted)
        return bool(OPTIMIZER_NAME.search(owner)) or "scaler" in owner.lower()
    return False


_LOSS_FUNCTION = re.compile(r"(fn|func|function|module|class|type)$", re.I)


def steps_with(arguments: list[str | None]) -> bool:
    """A call handed both a loss value and an optimizer (`loss_scaler(loss, optimizer, clip_grad=1.0)`, timm's
    `NativeScaler`; `self.backward_step(total_loss, self.opt)`): it backpropagates and steps the optimizer. (Handed
    a loss function, a network or the data as well, `train_one_epoch(model, data, loss, optimizer)`, it is a whole
    training run instead.)"""
    names = [last_part(a) for a in arguments if a]
    # (one loss value: `losses`, a collection of them, is not what a scaler is handed)
    return any(is_loss_value(n) and not n.lower().endswith("es") for n in names) \
        and any(OPTIMIZER_NAME.search(n) for n in names) and not any(
        MODEL_NAME.search(n) or _DATA_NAME.search(n) for n in names)  # `train_one_epoch(model, data, loss, opt)`


_DATA_NAME = re.compile(r"loader|^data(set)?$|^batch", re.I)


def is_loss_value(name: str) -> bool:
    """A name that says it holds a loss: `loss`, `total_loss`, `loss_reduced`, `losses_reduced_scaled`; not a loss
    function (`loss_fn`, `criterion`)."""
    lowered = name.lower()
    return "loss" in lowered and not _LOSS_FUNCTION.search(lowered)


def is_env_step(dotted: str | None) -> bool:
    """One step of a host-side environment or game: `env.step(a)`, `self.envs.step(a)`, `game.play(move)`,
    `environment.policy_step(policy)`."""
    method = last_part(dotted)
    return (method in ENV_METHODS or method.endswith("_step") and not method.startswith(("train", "optim", "update",
                                                                                        "learn", "eval")))\
        and bool(ENV_RECEIVER.search(receiver(dotted)))


def returns_observation(dotted: str | None) -> bool:
    """What a host-side environment returns: `env.step(a)` as `is_env_step`, and `env.reset()`."""
    return is_env_step(dotted) or last_part(dotted) == "reset" and bool(ENV_RECEIVER.search(receiver(dotted)))


def is_network_call(dotted: str | None, network_classes: frozenset[str] = frozenset()) -> bool:
    """`model(x)`, `self.net(x)`, `policy(obs)`, `net.predict(x)`, `network.initial_inference(obs)`; and, given the
    normalised names of the program's network classes (`network_class_names`), a value named after one of them:
    `self.muZero.predict(x)` where `class MuZero(nn.Module)`."""
    name = last_part(dotted)
    parts = (dotted or "").split(".")
    # (named after a class only as a variable or an attribute of `self`: `decoder.attention(h)` calls a submodule
    # of the decoder, a piece of its forward pass, not an evaluation of a network the loop stands for)
    if MODEL_NAME.search(name) and name != "module" or parts[:-1] in ([], ["self"]) and _named_after(
            name, network_classes):
        return True
    holder = receiver(dotted)
    return name in NETWORK_METHODS and bool(MODEL_NAME.search(holder) or parts[:-2] in ([], ["self"]) and _named_after(
        holder, network_classes))


_NOT_A_NETWORK_CLASS = re.compile(r"loss|criterion|metric|norm$|layer$|block$|embedding", re.I)


def network_class_names(classes: Iterable[str]) -> frozenset[str]:
    """The program's network classes, named as a value holding one would be (`MuZero` -> `muzero`, matching
    `muZero` and `mu_zero`); losses, metrics and single layers are left out (a `loss(...)` call is no forward)."""
    return frozenset(normalised_name(name) for name in classes if not _NOT_A_NETWORK_CLASS.search(name))


def _named_after(name: str, network_classes: frozenset[str]) -> bool:
    """A value (not the class itself: `MuZero(game)` builds one) whose name is a network class's."""
    return bool(network_classes) and not name[:1].isupper() and normalised_name(name) in network_classes


def normalised_name(name: str) -> str:
    """A name as spelled without case or underscores: `muZero`, `mu_zero` and `MuZero` are one."""
    return name.replace("_", "").lower()


def throttles(names: set[str], has_modulo: bool) -> bool:
    """Does an `if` test with these names (and maybe a `%`) run its body only now and then?"""
    return has_modulo or any(THROTTLE_NAME.search(name) for name in names)


# `step % N` with N at most this runs (nearly) every step: `log_interval = 1`, `--policy_delay 2`
EVERY_STEP_MODULUS = 2


RARE_MODULUS = 10  # `x % N == 0` with N at least this runs at most a tenth of the time


def every_step(divisor: int | None) -> bool:
    """Is `x % divisor == 0` true (nearly) every step? None: the divisor's value is not known."""
    return divisor is not None and 0 < divisor <= EVERY_STEP_MODULUS


SYNCHRONIZE_CALLS = {"torch.cuda.synchronize", "torch.accelerator.synchronize"}
# Reading a clock: what a synchronize before it makes accurate.
TIMER_READS = {"time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic",
               "time.monotonic_ns", "timeit.default_timer"}
