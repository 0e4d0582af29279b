from __future__ import annotations

import re

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import FileAnalysis, PerFileFacts, dotted_name, method_name, string_value, walk
from gpulint.rule import is_test_path
from gpulint.semantic.dataflow import flow_from, names_in
from gpulint.semantic.loaders import LoaderFlow, iterated_expressions
from gpulint.semantic.modules import code_of
from gpulint.semantic.placement import last_name
from gpulint.semantic.vocab import is_env_step

_EVAL_FUNCTION = re.compile(r"^_?(evaluate|evaluation|validate|validation|eval|test|predict|inference|infer|"
                            r"run_eval|run_validation|run_test)(_(epoch|one_epoch|model|loop|all|dataset|set|split|policy|agent|episodes?))?$")
# autoregressive sampling and decoding loops (`def generate(self, idx, n): for _ in range(n): logits = self(idx)`);
# not when the body keeps scores a policy gradient trains on (log-probabilities, gathered logits)
_GENERATION_FUNCTION = re.compile(r"^_?(generate|sample|sampling|greedy_decode|beam_search|translate)"
                                  r"(_(text|tokens?|sequences?|images?|sentence|batch))?$")
# a policy's action choice (`select_action`, `get_action`, `act`, `actor_pick_action`): called per iteration of a
# loop that both acts and trains, it is judged like a function of a rollout
# (`evaluate_actions` scores given actions for the policy loss: training, not acting)
_ACTING_FUNCTION = re.compile(r"^_?(?!evaluate_)(\w+_)?(act|actions?)$")
_KEEPS_SCORES = re.compile(r"log_prob|log_softmax|\.gather\(|requires_grad")
_EVAL_ITERABLE = re.compile(r"(^|_)(val|valid|validation|test|testing|eval|evaluation|dev|holdout)(_|$|loader|data|"
                            r"set|dl|ds|iter|batches)|^(val|valid|test|eval|dev)[a-z]*loader$", re.I)
_MODEL_NAME = re.compile(r"(^|_)(model|net|network|policy|actor|critic|encoder|decoder|generator|discriminator|"
                         r"classifier|backbone|agent|transformer|q_net|qnet|unet|vae|autoencoder|resnet|vgg)s?(_|$|\d)",
                         re.I)
_GRAD_MODES = {"torch.no_grad", "torch.inference_mode", "torch.set_grad_enabled", "torch.enable_grad",
               "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad", "torch.autograd.inference_mode",
               "torch.autograd.grad_mode.inference_mode", "torch.autograd.set_grad_enabled",
               "torch.autograd.enable_grad", "torch.autograd.grad_mode.set_grad_enabled"}
# the network's output is used as data: detached, read back or converted
_DATA_USE = re.compile(r"\.(detach|cpu|numpy|item|tolist)\(|\.data\b")
_NEEDS_GRAD = re.compile(r"\.backward\(|autograd\.grad\(|\bgrad\(|requires_grad_\(|requires_grad\s*=\s*True|"
                         r"set_grad_enabled|enable_grad|torch\.func\.|functorch|jacobian|hessian|\bvjp\(|\bjvp\(|"
                         r"\b\w*(optim|opt|scaler)\w*\.step\(|retain_grad\(|register_hook\(|saliency|adversarial|"
                         r"attack|fgsm|pgd|integrated_gradients|captum", re.I)
_NOT_FORWARD = {"eval", "train", "to", "cuda", "cpu", "parameters", "state_dict", "zero_grad", "modules", "children",
                "apply", "half", "float", "double", "bfloat16", "requires_grad_", "add_module", "get_submodule",
                "get_parameter", "buffers", "save_pretrained", "from_pretrained", "resize_token_embeddings", "append",
                "extend", "update", "reset", "save", "step", "sample", "seed", "close", "render", "log", "print"}
_NOT_FORWARD_PREFIXES = ("register_", "named_", "load_", "set_", "_")
_CALLER_NO_GRAD = r"^([ \t]*)(with\s+[^\n]*\b(no_grad|inference_mode)\s*\(|@[\w.]*\b(no_grad|inference_mode)\b)"


# examples (below) whose expected fix is the same text with the acting or sampling method decorated
_DETACHED_LOG_PROB = """
            import torch
            from torch.distributions import Categorical

            class Agent:
                def get_action(self, obs):
                    logits = self.actor(torch.as_tensor(obs, dtype=torch.float32))
                    dist = Categorical(logits=logits)
                    action = dist.sample()
                    log_prob = dist.log_prob(action)
                    return action.detach().numpy(), log_prob.detach()

                def rollout(self, env):
                    obs = env.reset()
                    for t in range(2048):
                        action, log_prob = self.get_action(obs)
                        obs, reward, done, _ = env.step(action)
            """


_ACTING_METHOD = """
            import torch
            import torch.nn as nn

            class Policy(nn.Module):
                def forward(self, x):
                    return self.mean(x), self.log_std(x)

                def get_action(self, state):
                    state = torch.FloatTensor(state).unsqueeze(0).to("cuda")
                    mean, log_std = self.forward(state)
                    return torch.tanh(mean).detach().cpu().numpy()[0]

            for step in range(1000):
                action = policy.get_action(state)
                state, reward, done, _ = env.step(action)
            """


_SAMPLING_LOOP = """
            import torch
            device = torch.device("cuda")
            class CharModel(torch.nn.Module):
                def generate(self, context, new_tokens):
                    for _ in range(new_tokens):
                        logits = self(context[:, -64:])[:, -1, :]
                        nxt = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
                        context = torch.cat((context, nxt), dim=1)
                    return context
            """


# a rollout method returning its network's output to a caller that only reads it back
_RETURNED_ACTION = """
            import torch
            import torch.nn as nn
            class Actor(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = nn.Linear(8, 2)
                def forward(self, s):
                    return self.body(s)
                def get_action(self, state):
                    mean = self.forward(torch.FloatTensor(state).unsqueeze(0).cuda())
                    return mean.squeeze(0)
            class Agent:
                def __init__(self):
                    self.actor = Actor().cuda()
                def choose_action(self, s):
                    a = self.actor.get_action(s)
                    return a.detach().cpu().numpy()
            def rollout(env, agent):
                s, done = env.reset(), False
                while not done:
                    s, r, done, _ = env.step(agent.choose_action(s))
            """


def _decorated(code: str, function: str = "get_action") -> str:
    """An example's expected fix: `function` decorated with `@torch.no_grad()`."""
    return re.sub(rf"^( *)def {function}\b", rf"\1@torch.no_grad()\n\1def {function}", code, count=1, flags=re.M)


class EvalWithoutNoGrad(Rule):
    """
    ## What it does
    Finds evaluation loops that call the model with autograd recording: a loop over a validation/test loader,
    or a loop inside a function named `evaluate`/`validate`/`test`/`predict`/`inference`, with no enclosing
    `torch.no_grad()`/`torch.inference_mode()` (context or decorator, also at the call sites in the program)
    and nothing that needs gradients. Also a function the program calls once per environment step, move or
    tree-search simulation (found through the call graph, in any file) that runs a network with grad mode on and
    only uses the output as data (`.detach()`, `.numpy()`, `.item()`, a program helper such as `to_np()` that
    reads its argument back to the host): acting needs no graph. In a loop or step function that both acts and
    trains (a DQN loop: pick the action with the network, step the environment, then update), each network call
    whose outputs are only read back to the host or handed to the environment before being replaced; and in a
    tree search written as one loop (a network evaluation per simulation), each such call. Also autoregressive
    sampling and decoding methods (`generate`, `sample`, `greedy_decode`, `beam_search`, `translate`) that run
    the network in a loop, unless they keep log-probabilities or gathered scores to train on.

    ## Why is this slow
    With grad mode on, every forward op saves its inputs for a backward pass that never comes: activation
    memory grows to training levels (limiting the evaluation batch size) and each op pays the autograd
    bookkeeping. The tuning guide: no_grad "accelerates execution and reduces the amount of required memory".

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x.cuda()).argmax(1) == y.cuda()).sum().item()
        return correct
    ```

    ## Use instead
    ```python
    @torch.no_grad()
    def evaluate(model, loader):
        ...
    ```
    (or `with torch.no_grad():` around the evaluation loop).

    ## Fix safety
    Safe: the fix adds `@torch.no_grad()` to the evaluation function, or wraps the evaluation loop in
    `with torch.no_grad():`; outputs are bitwise identical and only lose `requires_grad`. It never fires when
    the region needs gradients (`backward`, `autograd.grad`, `requires_grad_`, `set_grad_enabled`,
    `enable_grad`, `torch.func`, an optimizer step, saliency/adversarial code), when every model call already
    runs under no_grad, when a caller already wraps the call in no_grad, or when the model's parameters are
    frozen (`model.requires_grad_(False)` or `p.requires_grad = False` for each of `model.parameters()`, in
    the function, another method of the class, or on the same model name elsewhere in the file, and never
    unfrozen), so that autograd records nothing. It does not use
    `torch.inference_mode()`: tensors created there raise later if used in autograd or modified in place.
    An acting call inside a loop or function that also trains gets `with torch.no_grad():` around its own
    statement, as an unsafe fix: its outputs were seen only being read back to the host or passed to the
    environment, but code the rule cannot see (a callee storing them) could still want their graph.
    """

    code = "GPU074"
    on_cpu_too = True  # recording a graph nobody backpropagates costs time and memory on any device
    name = "eval-without-no-grad"
    message = "Evaluation loop runs the model with autograd recording; wrap it in `torch.no_grad()`"
    fix_title = "Run the evaluation under `torch.no_grad()`"
    severity = Severity.INFO
    safety = Safety.SAFE
    priority = "P3"
    triggers = ("val", "test", "eval", "predict", "infer", "dev", "step(", "play", "simulat")
    examples = [
        Valid(
            """
            import torch
            @torch.no_grad()
            def evaluate(model, loader):
                return [model(x).argmax(1) for x, _ in loader]
            """
        ),
        Valid(  # the program's own decorator runs the function under no_grad
            """
            import torch

            def nograd(f):
                def new_f(*args, **kwargs):
                    with torch.no_grad():
                        return f(*args, **kwargs)
                return new_f

            class Detector(torch.nn.Module):
                @nograd
                def predict(self, imgs):
                    return [self(img.cuda()).argmax().item() for img in imgs]

            def play(detector, env):
                while True:
                    env.step(detector.predict(env.observe()))
            """
        ),
        Valid(  # a tree node's setter named after the policy it stores is no network (the search evaluates under
            # no_grad elsewhere)
            """
            import torch

            def expand(node, policy_values):
                probabilities = torch.softmax(policy_values.cpu()[node.legal], dim=0)
                node.set_children_policy_values(probabilities)

            def search(root, net, simulations):
                for _ in range(simulations):
                    leaf = root.select()
                    with torch.no_grad():
                        policy, value = net(leaf.tensor())
                    expand(leaf, policy)
            """
        ),
        Valid(  # sequence-level policy gradient: the sampled tokens' log-probabilities are trained on
            """
            import torch
            device = torch.device("cuda")
            class Writer(torch.nn.Module):
                def sample(self, start, steps):
                    tokens, scores = start, []
                    for _ in range(steps):
                        logits = self(tokens)[:, -1]
                        nxt = torch.multinomial(logits.softmax(-1), 1)
                        scores.append(logits.log_softmax(-1).gather(1, nxt))
                        tokens = torch.cat([tokens, nxt], dim=1)
                    return tokens, torch.cat(scores, dim=1)
            """
        ),
        Invalid(  # an autoregressive sampling loop records a graph for every generated token
            _SAMPLING_LOOP,
            fixed=_decorated(_SAMPLING_LOOP, "generate"),
        ),
        Valid(  # gradients are needed: saliency maps
            """
            import torch
            def evaluate(model, loader):
                maps = []
                for x, y in loader:
                    x.requires_grad_(True)
                    model(x).gather(1, y[:, None]).sum().backward()
                    maps.append(x.grad.abs())
                return maps
            """
        ),
        Valid(  # every parameter is frozen: autograd records nothing
            """
            import torch
            def evaluate(model, loader):
                for p in model.parameters():
                    p.requires_grad = False
                model.eval()
                predictions = []
                for x, _ in loader:
                    predictions.append(model(x).argmax(1))
                return predictions
            """
        ),
        Valid(  # frozen in another method of the class
            """
            import torch
            class Evaluator:
                def __init__(self, net):
                    self.net = net.eval()
                    self.net.requires_grad_(False)
                def evaluate(self, loader):
                    correct = 0
                    for x, y in loader:
                        correct += (self.net(x).argmax(1) == y).sum().item()
                    return correct
            """
        ),
        Valid(  # a loader freezes its local model and returns it
            """
            import torch
            class Predictor:
                def __init__(self, path):
                    self.model = self._load(path)
                def _load(self, path):
                    net = torch.load(path)
                    for p in net.parameters():
                        p.requires_grad = False
                    return net
                def predict(self, batches):
                    outputs = []
                    for x in batches:
                        outputs.append(self.model(x))
                    return outputs
            """
        ),
        Valid(  # frozen elsewhere in the file, under the same name
            """
            import torch
            encoder.requires_grad_(False)
            for epoch in range(epochs):
                train_head(head, encoder, train_loader)
                for x, _ in val_loader:
                    features.append(encoder(x))
            """
        ),
        Invalid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x.cuda()).argmax(1) == y.cuda()).sum().item()
                return correct
            """,
            fixed="""
            import torch
            @torch.no_grad()
            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x.cuda()).argmax(1) == y.cuda()).sum().item()
                return correct
            """,
        ),
        Invalid(
            """
            import torch
            for epoch in range(epochs):
                train_one_epoch(model, train_loader, optimizer)
                model.eval()
                total = 0.0
                for x, y in val_loader:
                    total += criterion(model(x), y).item()
            """,
            fixed="""
            import torch
            for epoch in range(epochs):
                train_one_epoch(model, train_loader, optimizer)
                model.eval()
                total = 0.0
                with torch.no_grad():
                    for x, y in val_loader:
                        total += criterion(model(x), y).item()
            """,
        ),
    ]
    examples = [*examples,
        Valid(  # REINFORCE: `forward` keeps each step's log-probability for the loss after the episode
            """
            import torch
            from torch import nn
            from torch.distributions import Categorical

            class ActorCritic(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = nn.Linear(8, 4)
                    self.logprobs = []

                def forward(self, state):
                    dist = Categorical(torch.softmax(self.body(torch.from_numpy(state).float()), dim=-1))
                    action = dist.sample()
                    self.logprobs.append(dist.log_prob(action))
                    return action.item()

            def train(env, policy, optimizer):
                for episode in range(1000):
                    state = env.reset()
                    for t in range(10000):
                        action = policy(state)
                        state, reward, done, _ = env.step(action)
                        if done:
                            break
                    loss = -torch.stack(policy.logprobs).sum()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """
        ),
        Valid(  # loading the shared weights is no forward; the forward itself runs under `no_grad`
            """
            import torch
            from torch import nn

            class ActorCritic(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = nn.Linear(8, 4)

                def forward(self, x):
                    return self.body(x)

            def test(shared_model, env):
                model = ActorCritic()
                state, done = env.reset(), True
                while True:
                    if done:
                        model.load_state_dict(shared_model.state_dict())
                    with torch.no_grad():
                        logit = model(state.unsqueeze(0))
                    state, reward, done, _ = env.step(logit.argmax().item())
            """
        ),
        Invalid(  # the network's output is returned to a caller that only reads it back: reported where it runs
            _RETURNED_ACTION, fixed=_decorated(_RETURNED_ACTION),
        ),
        Invalid(
            """
            import torch

            class Agent:
                def __init__(self, actor):
                    self.actor = actor

                def choose_action(self, s):
                    s = torch.tensor(s, dtype=torch.float).unsqueeze(0)
                    a = self.actor(s).detach().numpy().flatten()
                    return a

            def rollout(env, agent):
                s = env.reset()
                for _ in range(1000):
                    a = agent.choose_action(s)
                    s, r, done, _ = env.step(a)
            """,
            fixed="""
            import torch

            class Agent:
                def __init__(self, actor):
                    self.actor = actor

                @torch.no_grad()
                def choose_action(self, s):
                    s = torch.tensor(s, dtype=torch.float).unsqueeze(0)
                    a = self.actor(s).detach().numpy().flatten()
                    return a

            def rollout(env, agent):
                s = env.reset()
                for _ in range(1000):
                    a = agent.choose_action(s)
                    s, r, done, _ = env.step(a)
            """,
        ),
        Valid(  # the caller already disables grad
            """
            import torch

            class Agent:
                def act(self, s):
                    return self.policy(torch.as_tensor(s)).argmax().item()

            def rollout(env, agent):
                s = env.reset()
                for _ in range(1000):
                    with torch.no_grad():
                        a = agent.act(s)
                    s, r, done, _ = env.step(a)
            """
        ),
        Valid(  # REINFORCE: the log-probabilities of the episode are trained on
            """
            import torch

            class Agent:
                def act(self, s):
                    probs = self.policy(torch.as_tensor(s))
                    action = probs.multinomial(1)
                    self.log_probs.append(probs.log()[action])
                    return action.item()

            def rollout(env, agent):
                s = env.reset()
                for _ in range(1000):
                    s, r, done, _ = env.step(agent.act(s))
            """
        ),
        Invalid(  # one loop acts and trains: the acting forward's outputs are only read back to the host
            """
            import torch

            for step in range(100000):
                q_values = q_net(torch.as_tensor(obs, device="cuda"))
                action = q_values.argmax(1).cpu().numpy()
                obs, reward, done, info = env.step(action)
                batch = buffer.sample(64)
                loss = (q_net(batch.obs).gather(1, batch.action) - batch.target).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch

            for step in range(100000):
                with torch.no_grad():
                    q_values = q_net(torch.as_tensor(obs, device="cuda"))
                action = q_values.argmax(1).cpu().numpy()
                obs, reward, done, info = env.step(action)
                batch = buffer.sample(64)
                loss = (q_net(batch.obs).gather(1, batch.action) - batch.target).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            count=1,
        ),
        Invalid(  # a tree search written inline: one evaluation per simulation, outputs read as data
            """
            import torch

            def search(net, root, simulations):
                for _ in range(simulations):
                    leaf = root.select_leaf()
                    x = torch.from_numpy(leaf.encode()).float().cuda()
                    priors, value = net(x)
                    priors = priors.detach().cpu().numpy()
                    leaf.expand(priors)
                    leaf.backup(value.item())
                return root

            def self_play(net, games):
                for game in range(games):
                    search(net, Root(), 800)
            """,
            fixed="""
            import torch

            def search(net, root, simulations):
                for _ in range(simulations):
                    leaf = root.select_leaf()
                    x = torch.from_numpy(leaf.encode()).float().cuda()
                    with torch.no_grad():
                        priors, value = net(x)
                    priors = priors.detach().cpu().numpy()
                    leaf.expand(priors)
                    leaf.backup(value.item())
                return root

            def self_play(net, games):
                for game in range(games):
                    search(net, Root(), 800)
            """,
            count=1,
        ),
        Valid(  # the value computed late in the loop is trained on at the top of the next iteration
            """
            import torch

            next_value = torch.zeros(1, device="cuda")
            for step in range(100000):
                loss = (reward + 0.99 * next_value - value_net(obs_t)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                obs, reward, done, info = env.step(env.sample_action())
                obs_t = torch.as_tensor(obs, device="cuda")
                next_value = value_net(obs_t)
                print(next_value.item())
            """
        ),
        Invalid(  # the log-probability is detached before it is returned: no graph is kept for a REINFORCE loss
            _DETACHED_LOG_PROB,
            fixed=_decorated(_DETACHED_LOG_PROB),
            count=1,
        ),
        Invalid(  # the network's own acting method, through `self.forward`
            _ACTING_METHOD,
            fixed=_decorated(_ACTING_METHOD),
            count=1,
        ),
        Valid(  # REINFORCE: the log-probability leaves with its graph, the update backpropagates through it
            """
            import torch
            from torch.distributions import Categorical

            class Agent:
                def get_action(self, obs):
                    dist = Categorical(logits=self.actor(torch.as_tensor(obs, dtype=torch.float32)))
                    action = dist.sample()
                    log_prob = dist.log_prob(action)
                    return action.item(), log_prob

                def rollout(self, env):
                    obs = env.reset()
                    for t in range(2048):
                        action, log_prob = self.get_action(obs)
                        self.log_probs.append(log_prob)
                        obs, reward, done, _ = env.step(action)
            """
        ),
        Valid(  # the acting outputs are kept for the update (an actor-critic's log-probabilities and values)
            """
            import torch

            for step in range(100000):
                logits, value = policy(torch.as_tensor(obs, device="cuda"))
                action = torch.distributions.Categorical(logits=logits).sample()
                obs, reward, done, info = env.step(action.cpu().numpy())
                values.append(value)
                if step % 5 == 0:
                    loss = compute_loss(values, rewards)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=("model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()\n"
               "batches = [torch.randn(8, 16) for _ in range(3)]"),
        before="out = torch.cat([model(x) for x in batches])\nrequires_grad = out.requires_grad and False",
        after=("with torch.no_grad():\n"
               "    out = torch.cat([model(x) for x in batches])\n"
               "requires_grad = out.requires_grad"),
        compare=("out", "requires_grad"),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported_functions: set[int] = set()

    # -- candidates --------------------------------------------------------------------------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if is_test_path(self.ctx.path):
            return
        generation = _GENERATION_FUNCTION.match(node.name.value) is not None
        if not _EVAL_FUNCTION.match(node.name.value) and not generation:
            self._check_rollout_function(node)
            return
        if _decorated_no_grad(self.ctx, node) or self._lightning_hook(node):
            return
        flow = LoaderFlow.of(self.ctx.analysis)
        calls = [c for c in self._model_calls(node.body) if _in_loop_within(flow, c, node)]
        if not calls:  # `def evaluate(self, s): return self.actor(s)...` called once per evaluation env step
            self._check_rollout_function(node)
            return
        body = self.ctx.code(node.body)
        if _NEEDS_GRAD.search(body) or generation and _KEEPS_SCORES.search(body):
            return
        if all(_under_grad_mode(self.ctx, flow, c, node) or self._frozen_model(c) for c in calls):
            return
        if self._called_under_no_grad(node.name.value):
            return
        self._reported_functions.add(id(node))
        if any(isinstance(d.decorator, (cst.Name, cst.Attribute)) and (dotted_name(d.decorator) or "").endswith(
                ("property", "setter", "getter")) for d in node.decorators):
            self.report(calls[0])
            return
        spelled, imports = self.ctx.spell("torch.no_grad")
        decorator = cst.Decorator(decorator=cst.parse_expression(f"{spelled}()"))
        new = node.with_changes(decorators=[*node.decorators, decorator])
        # reported where the graph is built (the first forward in the loop); the fix decorates the function
        message = "Sampling loop runs the model with autograd recording; decorate it with `torch.no_grad()`" \
            if generation else None
        self.report(calls[0], message, replacements=[(node, new)], imports=imports)

    def visit_While(self, node: cst.While) -> None:
        self._check_inline_acting_loop(node)

    def visit_For(self, node: cst.For) -> None:
        if is_test_path(self.ctx.path):
            return
        self._check_inline_acting_loop(node)
        if not any(_eval_iterable(e) for e in iterated_expressions(node.iter)):
            return
        flow = LoaderFlow.of(self.ctx.analysis)
        function = flow.enclosing_function(node)
        if function is not None and (id(function) in self._reported_functions
                                     or _EVAL_FUNCTION.match(function.name.value)
                                     or _GENERATION_FUNCTION.match(function.name.value)):
            return  # the function-level finding covers it
        if function is not None and _decorated_no_grad(self.ctx, function):
            return
        if any(isinstance(n, cst.FunctionDef) and _decorated_no_grad(self.ctx, n) for n in self.ctx.ancestors):
            return
        calls = list(self._model_calls(node))
        if not calls or _NEEDS_GRAD.search(self.ctx.code(node)):
            return
        if all(_under_grad_mode(self.ctx, flow, c, None) or self._frozen_model(c) for c in calls):
            return
        if self._used_for_backward_later(node, function):
            return
        if function is not None and self._called_under_no_grad(function.name.value):
            return
        if node.asynchronous is not None or any(
                isinstance(n, (cst.Yield, cst.Await)) for n in walk(node, into_functions=True)):
            self.report(node.iter)
            return
        spelled, imports = self.ctx.spell("torch.no_grad")
        inner = node.with_changes(leading_lines=())
        wrapped = cst.With(
            items=[cst.WithItem(cst.parse_expression(f"{spelled}()"))],
            body=cst.IndentedBlock(body=[inner]),
            leading_lines=node.leading_lines,
        )
        self.report(node.iter, replacements=[(node, wrapped)], imports=imports)

    def _check_rollout_function(self, node: cst.FunctionDef) -> None:
        """A function the program calls once per environment step, move or tree-search simulation (the call
        graph's rollout frequency) that runs a network with grad mode on and only uses its output as data
        (`.detach()`, `.cpu()`, `.numpy()`, `.item()`): acting, not training."""
        hot = self.ctx.analysis.hot.get(id(node))
        if hot is not HotKind.ROLLOUT and id(node) not in self.ctx.analysis.evaluation_rollout:
            if hot not in (HotKind.STEP_FUNCTION, HotKind.CALLEE):
                return
            reported = len(self.reports)
            self._check_acting_calls(node, node)  # `def step(self)`: act in the environment, then train
            if hot is HotKind.STEP_FUNCTION or len(self.reports) > reported \
                    or not _ACTING_FUNCTION.match(node.name.value):
                return
            # `def select_action(self, s)` called once per iteration of a loop that acts and trains: acting
        if _decorated_no_grad(self.ctx, node) or self._lightning_hook(node):
            return
        flow = LoaderFlow.of(self.ctx.analysis)
        key = self.ctx.analysis.key_of(node)
        calls = [c for c in self._model_calls(node.body) if not self._frozen_model(c)
                 and not _under_grad_mode(self.ctx, flow, c, node)
                 and f"{key}#evaluates-read-back:{last_name(c.func)}" not in self.ctx.analysis.program_keys]
        body = self.ctx.code(node.body)
        readers = self._host_readers(key)  # `to_np(q)`: a program helper reading its argument back to the host
        keeps_log_prob = bool(re.search(r"\blog_prob", body)) and _keeps_log_prob_graph(flow, node, readers)
        # gradients needed here, or in what it calls (`update_params(optim, loss)` backpropagating in a helper)
        # (or its caller backpropagates what it returns: `loss, q = self.calculate_loss(...)`)
        trains = _NEEDS_GRAD.search(body) is not None or f"{key}#trains" in self.ctx.analysis.program_keys \
            or f"{key}#returns-trained" in self.ctx.analysis.program_keys
        if calls and trains and not keeps_log_prob:
            self._check_acting_calls(node, node)  # acting and training in one function: judge each call
            return
        if not calls or trains or keeps_log_prob:
            return  # no network, gradients needed, REINFORCE keeps log-probs with their graph
        if readers:
            calls = [c for c in calls if _read_back(node, c, readers)]
            if not calls:
                return
        elif not _DATA_USE.search(body) and not _outputs_consumed_here(node, calls) \
                and f"{key}#returns-read-back" not in self.ctx.analysis.program_keys:
            return  # outputs may leave the function with their graph (returned, stored) and be trained on
        if self._called_under_no_grad(node.name.value):
            return
        returns_graph = _returns_graph(node, calls) and not readers \
            and f"{key}#returns-read-back" not in self.ctx.analysis.program_keys  # every caller reads it back
        self._reported_functions.add(id(node))
        spelled, imports = self.ctx.spell("torch.no_grad")
        decorator = cst.Decorator(decorator=cst.parse_expression(f"{spelled}()"))
        fix = [(node, node.with_changes(decorators=[*node.decorators, decorator]))]
        note = None
        if returns_graph:  # no caller is seen training on it, but one the program does not show might
            fix, imports = [], ()
            note = (f"`{node.name.value}()` returns a network output with its graph; if no caller trains on it, "
                    "decorate the function with `@torch.no_grad()` or detach what it returns")
        for index, call in enumerate(calls):  # each evaluation is a graph built per step; one fix covers all
            self.report(call, f"`{node.name.value}()` runs a network with autograd recording on every "
                              "environment step or search simulation, then uses the output as data; acting needs "
                              "no graph: decorate it with `@torch.no_grad()`",
                        replacements=fix if index == 0 else (), imports=imports if index == 0 else (),
                        safety=Safety.UNSAFE, note=note)

    # -- acting inside training code -----------------------------------------------------------------

    def _check_inline_acting_loop(self, loop: cst.For | cst.While) -> None:
        """The outermost step or rollout loop written inline (not in a function the call graph judges): a DQN
        loop picks an action with the network, steps the environment, then trains, all in one body."""
        function = self.ctx.enclosing(cst.FunctionDef)
        if is_test_path(self.ctx.path) or isinstance(function, cst.FunctionDef) and self.ctx.analysis.hot.get(
                id(function)) in (HotKind.STEP_FUNCTION, HotKind.CALLEE, HotKind.ROLLOUT):
            return  # a hot function is judged as a whole (`_check_rollout_function`)
        if id(function) in self._reported_functions:
            return  # the function is already reported (a sampling loop decorated as a whole)
        inside = self.ctx.ancestors[next((i for i, n in enumerate(self.ctx.ancestors) if n is function), 0):-1]
        if self.ctx.analysis.hot.get(id(loop)) not in (HotKind.STEP_LOOP, HotKind.ROLLOUT) or any(
                self.ctx.analysis.hot.get(id(n)) in (HotKind.STEP_LOOP, HotKind.ROLLOUT)
                for n in inside if isinstance(n, (cst.For, cst.While))):
            return
        self._check_acting_calls(loop, function if isinstance(function, cst.FunctionDef) else None)

    def _check_acting_calls(self, region: cst.FunctionDef | cst.For | cst.While,
                            function: cst.FunctionDef | None) -> None:
        """Network calls of a region that also trains (or steps an environment) whose outputs are only read as
        data (`.cpu().numpy()`, `.item()`, a host-reading helper, the environment's `step`) before being
        replaced: the action was picked with autograd recording. Each is reported with its statement wrapped
        in `torch.no_grad()`."""
        searching = isinstance(region, (cst.For, cst.While)) and self.ctx.analysis.hot.get(
            id(region)) is HotKind.ROLLOUT and not _NEEDS_GRAD.search(self.ctx.code(region))
        if not searching and not any(isinstance(n, cst.Call) and is_env_step(dotted_name(n.func))
                                     for n in walk(region.body)):
            return  # acting means stepping an environment or game here, or evaluating positions of a search
        flow = LoaderFlow.of(self.ctx.analysis)
        key = self.ctx.analysis.key_of(function)
        readers = self._host_readers(key)
        for call in self._model_calls(region.body):
            if _under_grad_mode(self.ctx, flow, call, function):
                continue
            if isinstance(call.func, cst.Attribute) and self.ctx.evidence.is_module(call.func.value) is None and \
                    self._method_records(call.func.attr.value):
                continue  # `agent.select_action(obs)`: a program method of a non-network, judged inside it
            if self._forward_keeps_outputs():
                continue  # `self.logprobs.append(...)` in `forward`: the graph is kept for a loss after the episode
            statement = _assigning_statement(region, call)
            if statement is None or not _only_read_as_data(flow, region, statement, readers) \
                    or self._frozen_model(call):
                continue
            if function is not None and (_decorated_no_grad(self.ctx, function)
                                         or self._called_under_no_grad(function.name.value)):
                return  # every call of the function already runs without grad
            spelled, imports = self.ctx.spell("torch.no_grad")
            wrapped = cst.With(items=[cst.WithItem(cst.parse_expression(f"{spelled}()"))],
                               body=cst.IndentedBlock(body=[statement.with_changes(leading_lines=())]),
                               leading_lines=statement.leading_lines)
            self.report(call, "The network runs with autograd recording on every environment step or "
                              "search simulation; its outputs are only read as data: run the call under "
                              "`torch.no_grad()`",
                        replacements=[(statement, wrapped)], imports=imports, safety=Safety.UNSAFE)

    # -- helpers -----------------------------------------------------------------------------------

    def _host_readers(self, key: str) -> frozenset[str]:
        """Names of program helpers the function calls that read their argument back to the host (`to_np`) or write
        every argument into NumPy arrays (`buffer.store(obs, val)`)."""
        prefixes = (f"{key}#downloads:", f"{key}#stores-to-host:")
        return frozenset(k.split(":", 1)[1] for k in self.ctx.analysis.program_keys if k.startswith(prefixes))

    def _model_calls(self, root: cst.CSTNode):
        """`model(x)`, `self.net(x)`, and forward-like methods with an input: `agent.get_action_and_value(obs)`."""
        for node in walk(root, into_functions=True):
            if not isinstance(node, cst.Call):
                continue
            func = node.func
            if isinstance(func, (cst.Name, cst.Attribute)) and self._plain_reference(func):
                name = func.value if isinstance(func, cst.Name) else func.attr.value
                if _MODEL_NAME.search(name) or self.ctx.evidence.is_module(func) is not None:
                    yield node
                    continue
            if isinstance(func, cst.Attribute) and func.attr.value == "forward" and \
                    self.ctx.evidence.is_module(func.value) is not None:
                yield node  # `self.forward(x)` in a method of the network (`get_action`)
                continue
            if isinstance(func, cst.Attribute) and _MODEL_NAME.search(func.attr.value) and isinstance(
                    func.value, (cst.Name, cst.Attribute)) and self.ctx.analysis.qualname(func) is None \
                    and not func.attr.value.startswith(_NOT_FORWARD_PREFIXES):  # not `node.set_policy_values(p)`
                yield node  # a network held by another object: `agent.prediction_model(state)`
                continue
            if isinstance(func, cst.Attribute) and isinstance(func.value, (cst.Name, cst.Attribute)) \
                    and self._submodule(func) and any(a.keyword is None for a in node.args):
                yield node  # `self.rnd.target(obs)`: a submodule of a network this object holds
                continue
            sampling_network = isinstance(func, cst.Attribute) and func.attr.value == "sample" and \
                self.ctx.evidence.is_module(func.value) is not None  # `self.policy.sample(state)`: a network's method
            if isinstance(func, cst.Attribute) and (func.attr.value not in _NOT_FORWARD or sampling_network) and \
                    not func.attr.value.startswith(_NOT_FORWARD_PREFIXES) and \
                    any(a.keyword is None for a in node.args):
                receiver = func.value
                if isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name) and \
                        receiver.value.value == "self":
                    receiver = receiver.attr
                if isinstance(receiver, cst.Name) and _MODEL_NAME.search(receiver.value) and \
                        self.ctx.analysis.qualname(receiver) is None and self._method_records(func.attr.value):
                    yield node

    def _submodule(self, func: cst.Attribute) -> bool:
        """`net.encoder`: an attribute of a value proven a network, named like no method the program defines (so a
        layer or a sub-network the network built, not a helper method)."""
        name = func.attr.value
        if name in _NOT_FORWARD or name.startswith(_NOT_FORWARD_PREFIXES) or self.ctx.evidence.is_module(
                func.value) is None:
            return False  # (`model.load_state_dict(...)`, `net.register_buffer(...)`: the module's own API)
        return not self._definitions(name)

    def _definitions(self, name: str) -> list:
        """(path, match) of every `def <name>(` in the program, its indent in group 1 and decorators in group 2
        (the program remembers each search)."""
        return self.ctx.program.search(
            re.compile(r"^([ \t]*)((?:@[^\n]*\n[ \t]*)*)def\s+" + re.escape(name) + r"\s*\(", re.M))

    def _method_records(self, name: str) -> bool:
        """A method defined in the program whose body runs with grad mode untouched. Methods we cannot see
        (library APIs such as `predict`/`generate`, which often disable grad themselves) do not count."""
        cache = self.__dict__.setdefault("_methods", {})
        if name in cache:
            return cache[name]
        found = False
        for path, match in self._definitions(name):
            text = self.ctx.program.sources.get(path, "")
            if re.search(r"no_grad|inference_mode", match.group(2)):
                found = False
                break
            if re.search(r"no_grad|inference_mode|set_grad_enabled", _body(text, match)):
                found = False
                break
            found = True
        cache[name] = found
        return found

    def _forward_keeps_outputs(self) -> bool:
        """Does a network of the program append what its `forward` computes to lists on itself (REINFORCE's
        `self.logprobs.append(dist.log_prob(action))`)? The action it returns is read as data, but the graph
        behind the kept values is what the episode's loss backpropagates."""
        if "_keeps_outputs" not in self.__dict__:
            self._keeps_outputs = False
            for path, match in self._definitions("forward"):
                if re.search(r"\bself\.\w+\.append\(", _body(self.ctx.program.sources.get(path, ""), match)):
                    self._keeps_outputs = True
                    break
        return self._keeps_outputs

    def _frozen_model(self, call: cst.Call) -> bool:
        """The called model's parameters are frozen (`model.requires_grad_(False)`, or `p.requires_grad =
        False` for every `p` in `model.parameters()`), so autograd records nothing: checked by the model's name
        anywhere in this file, which covers the same function, the class's methods (`self.model`) and a
        loader that freezes a local model and returns it (`self.model = self._load()`)."""
        func = call.func
        if isinstance(func, cst.Attribute) and not self._plain_reference(func):
            func = func.value  # `model.encode(x)`, `self.model.features(x)`: the model is the receiver
        name = _model_key(func)
        return name is not None and name in _FrozenModels.of(self.ctx.analysis).names

    def _plain_reference(self, func: cst.BaseExpression) -> bool:
        """`model(x)` / `self.net(x)`, not `model.eval()` or `torch.cat(...)`."""
        if isinstance(func, cst.Name):
            return self.ctx.analysis.qualname(func) is None
        return isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"

    def _lightning_hook(self, node: cst.FunctionDef) -> bool:
        info = self.ctx.analysis.function_class.get(id(node))
        return info is not None and any("Lightning" in base for base in info.base_names)

    def _used_for_backward_later(self, loop: cst.For, function: cst.FunctionDef | None) -> bool:
        """A name assigned in the loop that feeds a backward() outside it (outputs stored, then trained on)."""
        scope = function.body if function is not None else self.ctx.module
        assigned: set[str] = set()
        for node in walk(loop, into_functions=True):
            if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                for target in targets:
                    assigned |= names_in(target)
            elif isinstance(node, cst.Call) and method_name(node) in ("append", "extend") and \
                    isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Name):
                assigned.add(node.func.value.value)
        if not assigned:
            return False
        for _ in range(3):  # names computed from them later on (`loss = f(targets)`)
            grown = False
            # last assignment first: with three rounds, this order decides how long a chain of names is followed
            for node in reversed(list(walk(scope, into_functions=True))):
                if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and not _loop_contains(loop, node) \
                        and node.value is not None and names_in(node.value) & assigned:
                    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                    new = set().union(*(names_in(t) for t in targets)) - assigned
                    if new:
                        assigned |= new
                        grown = True
            if not grown:
                break
        for node in walk(scope, into_functions=True):
            if node is loop:
                continue
            if isinstance(node, cst.Call) and (method_name(node) == "backward" or (
                    dotted_name(node.func) or "").endswith("autograd.grad")):
                used = names_in(node)
                if used & assigned or _loop_contains(loop, node):
                    return True
        return False

    def _called_under_no_grad(self, name: str) -> bool:
        """Some call site of `name` in the program runs under no_grad / inference_mode (or wraps it)."""
        cache = self.__dict__.setdefault("_under_no_grad", {})
        if name not in cache:
            cache[name] = self._search_no_grad_callers(name)
        return cache[name]

    def _search_no_grad_callers(self, name: str) -> bool:
        wrapped = re.compile(r"(no_grad|inference_mode)\(\)\(\s*(\w+\.)*" + re.escape(name) + r"\b")
        call = re.compile(r"^([ \t]*).*\b" + re.escape(name) + r"\s*\(", re.M)
        for path, text in self.ctx.program.sources.items():
            if name not in text:
                continue
            if wrapped.search(text):
                return True
            lines = text.splitlines()
            for match in call.finditer(text):
                line_no = text.count("\n", 0, match.start())
                if re.match(r"\s*(async\s+)?def\s", lines[line_no]):
                    continue
                if _inside_no_grad_block(lines, line_no):
                    return True
        return False


def _body(text: str, definition: re.Match) -> str:
    """The body of the function whose `def` line `definition` matched (group 1: its indent), up to the next
    definition at that indent or the next top-level line."""
    rest = text[definition.end():]
    newline = rest.find("\n")
    rest = rest[newline + 1:] if newline >= 0 else ""
    end = re.search(r"^" + re.escape(definition.group(1)) + r"(def|class|@)\b|^\S", rest, re.M)
    return rest[:end.start()] if end else rest


def _assigning_statement(region: cst.CSTNode, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The line `out = net(x)` / `a, b, c = agent.act(x)` / `q = net(x)["q"]` that binds the call's result."""
    for node in walk(region):
        if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 and isinstance(node.body[0], cst.Assign):
            value = node.body[0].value
            if value is call or isinstance(value, cst.Subscript) and value.value is call:
                return node
    return None


_HOST_READS = ("cpu", "numpy", "item", "tolist")


def _keeps_log_prob_graph(flow: LoaderFlow, function: cst.FunctionDef, readers: frozenset[str]) -> bool:
    """Does the function keep a log-probability with its graph (REINFORCE trains on it later)? Not when each
    `dist.log_prob(a)` is bound to a name that is only read as data (`return action, log_prob.detach()`);
    a `log_prob` that is no such call (a network output named so) is taken as kept."""
    calls = [n for n in walk(function.body) if isinstance(n, cst.Call) and method_name(n) == "log_prob"]
    for call in calls:
        statement = _assigning_statement(function, call)
        if statement is None or not _only_read_as_data(flow, function, statement, readers,
                                                       (*_HOST_READS, "detach")):
            return True
    return not calls


def _only_read_as_data(flow: LoaderFlow, region: cst.CSTNode, defining: cst.SimpleStatementLine,
                       readers: frozenset[str], reading: tuple[str, ...] = _HOST_READS) -> bool:
    """In source order after `defining`, every use of the names it binds (and of values computed from them) reads
    them as data or hands them to the environment, until they are rebound; at least one such read exists."""
    assign = defining.body[0]
    assert isinstance(assign, cst.Assign)
    alive = _bound_by([assign]) - {"_"}  # `a, _, _ = ...`: `_` is discarded
    if _used_earlier_in_its_loop(flow, defining, alive):
        return False  # read at the top of the next iteration (`loss = ... value ...` before `value = net(s2)`)
    reads, started = 0, False
    for node in walk(region.body):
        if node is defining:
            started = True
            continue
        if not started or not alive:
            continue
        if isinstance(node, (cst.If, cst.While)):
            unit: cst.CSTNode = node.test
        elif isinstance(node, cst.For):
            unit = node.iter
        elif isinstance(node, cst.SimpleStatementLine):
            unit = node
        else:
            continue
        assigns = [small for small in getattr(unit, "body", ()) if isinstance(small, cst.Assign)]
        targets = _bound_by(assigns)
        used = (names_in(unit) - targets).union(*(names_in(a.value) for a in assigns))
        if not used & alive:
            alive -= targets  # rebound to something else
            continue
        if used & alive <= _names_read_on_host(unit, readers, reading):
            reads += 1
            alive -= targets  # host data now
            continue
        if assigns and isinstance(unit, cst.SimpleStatementLine) and len(unit.body) == 1:
            alive |= targets  # a value computed from the output: follow it
            continue
        return False  # used otherwise: kept, returned, branched on, trained on
    return reads > 0


def _used_earlier_in_its_loop(flow: LoaderFlow, defining: cst.SimpleStatementLine, names: set[str]) -> bool:
    """Is one of `names` read, in the innermost loop that runs `defining` (within its function), by a statement
    before it? That statement sees the previous iteration's value, unless an earlier statement of its own block
    set the name (`if eval_mode: a = net(s); a = a.cpu()` before the training branch's `a = net(s)`)."""
    loop = None
    for node in reversed(flow.ancestors(defining)):
        if isinstance(node, (cst.FunctionDef, cst.Lambda)):
            break
        if isinstance(node, (cst.For, cst.While)):
            loop = node
            break
    if loop is None:
        return False
    for node in walk(loop.body):
        if node is defining:
            return False
        if isinstance(node, cst.SimpleStatementLine):
            read = (names_in(node) - _bound_by([s for s in node.body if isinstance(s, cst.Assign)])) & names
            if read - _set_before_in_block(flow, node):
                return True
        elif isinstance(node, (cst.If, cst.While)) and names_in(node.test) & names:
            return True
    return False


def _set_before_in_block(flow: LoaderFlow, statement: cst.SimpleStatementLine) -> set[str]:
    """Names assigned by the statements before `statement` in its own block."""
    block = flow.parents.get(id(statement))
    found: set[str] = set()
    for sibling in getattr(block, "body", ()):
        if sibling is statement:
            break
        if isinstance(sibling, cst.SimpleStatementLine):
            found |= _bound_by([s for s in sibling.body if isinstance(s, cst.Assign)])
    return found


def _bound_by(assigns: list[cst.Assign]) -> set[str]:
    """Names the assignments bind (`a, b = ...`, `x = y = ...`)."""
    return set().union(*(names_in(t.target) for a in assigns for t in a.targets))


def _names_read_on_host(unit: cst.CSTNode, readers: frozenset[str], reading: tuple[str, ...] = _HOST_READS
                        ) -> set[str]:
    """Names whose values this statement reads back to the host: inside what `.cpu()`, `.numpy()`, `.item()` or
    `.tolist()` (`reading`) is called on, or passed to a host-reading helper of the program or to an environment's
    step."""
    read: set[str] = set()
    for node in walk(unit):
        if not isinstance(node, cst.Call) or not isinstance(node.func, (cst.Name, cst.Attribute)):
            continue
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in reading:
            read |= names_in(node.func.value)
        elif (node.func.value if isinstance(node.func, cst.Name) else node.func.attr.value) in readers \
                or is_env_step(dotted_name(node.func)):
            read |= set().union(*(names_in(arg.value) for arg in node.args)) if node.args else set()
    return read


def _read_back(function: cst.FunctionDef, call: cst.Call, readers: frozenset[str]) -> bool:
    """Does the network output (or a value computed from it) reach a helper that reads it back to the host
    (`to_np(q.argmax(-1))`)? Then it is used as data there."""
    outputs = _derived_from(function, [call])
    for node in walk(function.body):
        if isinstance(node, cst.Call) and isinstance(node.func, (cst.Name, cst.Attribute)) and (
                node.func.value if isinstance(node.func, cst.Name) else node.func.attr.value) in readers:
            if any(names_in(arg.value) & outputs or any(inner is call for inner in walk(arg.value))
                   for arg in node.args):
                return True
    return False


def _derived_from(function: cst.FunctionDef, calls: list[cst.Call]) -> frozenset[str]:
    """Names bound to the network outputs and to values computed from them (not through `.detach()` & co.)."""
    return flow_from(function, calls, lambda value, _: bool(_DATA_USE.search(code_of(value)))).names


def _returns_graph(function: cst.FunctionDef, calls: list[cst.Call]) -> bool:
    """Does the function return a network output with its graph (`return value, logits`, `return net(x)`), not
    detached or read as data? Its caller may train on it (a loss built from a rollout's values)."""
    outputs = _derived_from(function, calls)
    for node in walk(function.body):
        if isinstance(node, cst.Return) and node.value is not None and not _DATA_USE.search(code_of(node.value)):
            if names_in(node.value) & outputs or any(inner in calls for inner in walk(node.value)):
                return True
    return False


def _outputs_consumed_here(function: cst.FunctionDef, calls: list[cst.Call]) -> bool:
    """Are the network outputs (and values computed from them) only handed to other calls inside the function
    (`state = net(obs)`, `tree.search(state)`), never returned, stored on an object or appended to a container?
    Then their graphs die with the call, and recording them was wasted."""
    assignments = [n for n in walk(function.body) if isinstance(n, cst.Assign)]
    if not all(any(a.value is call for a in assignments) for call in calls):
        return False  # an output used in place (`return net(x)`, `buf.append(net(x))`)
    flow = flow_from(function, calls, _opaque_call)  # outputs, then names computed from them
    if flow.kept:
        return False  # `self.state = net(obs)`, `buf[i] = value`: kept
    for node in walk(function.body):
        if isinstance(node, cst.Return) and node.value is not None and names_in(node.value) & flow.names:
            return False
        if isinstance(node, cst.Call) and method_name(node) in ("append", "extend", "insert", "add", "put") \
                and any(names_in(arg.value) & flow.names for arg in node.args):
            return False
    return bool(flow.names)


def _opaque_call(value: cst.BaseExpression, outputs: set[str] | frozenset[str]) -> bool:
    """A call of a program function given an output (`self.tree.run(n, state)`): what it returns is its own
    business (a search returns visit counts), unlike torch ops and methods of the output itself."""
    if not isinstance(value, cst.Call) or names_in(value.func) & outputs:
        return False
    root = value.func
    while isinstance(root, cst.Attribute):
        root = root.value
    return not (isinstance(root, cst.Name) and root.value in ("torch", "F", "nn"))


def _inside_no_grad_block(lines: list[str], line_no: int) -> bool:
    """Textual: is line `line_no` inside a `with ...no_grad()` block or a no_grad-decorated function?"""
    indent = len(lines[line_no]) - len(lines[line_no].lstrip())
    for index in range(line_no - 1, -1, -1):
        text = lines[index]
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        level = len(text) - len(text.lstrip())
        if re.match(_CALLER_NO_GRAD, text) and (level < indent or stripped.startswith("@")):
            if stripped.startswith("@"):
                # a decorator applies to the def right below it, which must enclose the call
                following = next((lines[j] for j in range(index + 1, line_no) if lines[j].strip()
                                  and not lines[j].strip().startswith("@")), "")
                f_level = len(following) - len(following.lstrip())
                if re.match(r"\s*(async\s+)?def\s", following) and f_level < indent:
                    return True
                continue
            return True
        if level < indent:
            indent = level
            if level == 0:
                return False
    return False


def _eval_iterable(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Subscript):
        key = node.slice[0].slice if node.slice else None
        if isinstance(key, cst.Index) and string_value(key.value) in ("val", "valid", "validation", "test", "eval",
                                                                      "dev"):
            return True
        return False
    dotted = dotted_name(node)
    return bool(dotted) and bool(_EVAL_ITERABLE.search(dotted.rsplit(".", 1)[-1]))


def _decorated_no_grad(ctx, function: cst.FunctionDef) -> bool:
    """`@torch.no_grad()`, `@torch.inference_mode()`, or a decorator of the program named for it (`@nograd`, a
    wrapper that calls the function under `with torch.no_grad():`)."""
    for decorator in function.decorators:
        target = decorator.decorator
        target = target.func if isinstance(target, cst.Call) else target
        if ctx.analysis.qualname(target) in _GRAD_MODES or _NO_GRAD_NAME.search(dotted_name(target) or ""):
            return True
    return False


_NO_GRAD_NAME = re.compile(r"no_?grad$|inference_mode$", re.I)


def _under_grad_mode(ctx, flow: LoaderFlow, call: cst.Call, stop: cst.CSTNode | None) -> bool:
    """Is `call` inside `with torch.no_grad()` / `inference_mode()` / `set_grad_enabled(...)` (same function)?"""
    for node in reversed(flow.ancestors(call)):
        if isinstance(node, cst.With):
            for item in node.items:
                expr = item.item.func if isinstance(item.item, cst.Call) else item.item
                if ctx.analysis.qualname(expr) in _GRAD_MODES or (dotted_name(expr) or "").endswith(
                        ("no_grad", "inference_mode")):
                    return True
        if isinstance(node, cst.FunctionDef):
            if _decorated_no_grad(ctx, node):
                return True
            if node is stop or stop is None:
                return False
    return False


def _in_loop_within(flow: LoaderFlow, call: cst.Call, function: cst.FunctionDef) -> bool:
    for node in reversed(flow.ancestors(call)):
        if node is function:
            return False
        if isinstance(node, (cst.For, cst.While, cst.CompFor)):
            return True
        if isinstance(node, (cst.FunctionDef, cst.Lambda)):
            return False
    return False


def _loop_contains(loop: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(n is node for n in walk(loop, into_functions=True))


def _model_key(node: cst.BaseExpression) -> str | None:
    """`model` for `model`, `self.model`, `args.model`; None for anything but a name path."""
    dotted = dotted_name(node)
    return dotted.rsplit(".", 1)[-1] if dotted else None


def _freeze_value(call: cst.Call) -> bool | None:
    """`x.requires_grad_(False)` -> True (freezes), `x.requires_grad_()`/`(True)` -> False, else None."""
    if method_name(call) != "requires_grad_":
        return None
    arg = call.args[0].value if call.args else None
    return isinstance(arg, cst.Name) and arg.value == "False"


def _parameters_of(node: cst.BaseExpression) -> str | None:
    """The model in `model.parameters()` / `self.net.named_parameters()`."""
    if isinstance(node, cst.Call) and method_name(node) in ("parameters", "named_parameters") \
            and isinstance(node.func, cst.Attribute):
        return _model_key(node.func.value)
    return None


def _loop_freezes(loop: cst.For | cst.CompFor, body: list[cst.CSTNode]) -> bool | None:
    """`for p in model.parameters(): p.requires_grad = False` (unconditionally, in the loop body itself):
    True; setting it to anything else, or only for some parameters: False; nothing about grads: None."""
    target = loop.target
    if isinstance(target, cst.Tuple) and target.elements:
        target = target.elements[-1].value  # `for name, p in model.named_parameters()`
    if not isinstance(target, cst.Name):
        return None
    verdict: bool | None = None
    for statement in body:
        smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
        for small in smalls:
            if isinstance(small, cst.Assign) and any(
                    isinstance(t.target, cst.Attribute) and t.target.attr.value == "requires_grad"
                    and dotted_name(t.target.value) == target.value for t in small.targets):
                if not (isinstance(small.value, cst.Name) and small.value.value == "False"):
                    return False
                verdict = True
            elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) \
                    and _freeze_value(small.value) is not None \
                    and dotted_name(small.value.func.value) == target.value:  # type: ignore[attr-defined]
                if not _freeze_value(small.value):
                    return False
                verdict = True
            elif "requires_grad" in cst.Module(body=[]).code_for_node(small):
                return False  # conditional or partial freezing: some parameters may still record
    return verdict


class _FrozenModels(PerFileFacts):
    """Names of models whose parameters this file freezes and never unfreezes. A function that freezes a
    local model and returns it passes the freezing on to what its result is assigned to."""

    def __init__(self, analysis: FileAnalysis) -> None:
        super().__init__(analysis)
        module = analysis.module
        functions = [n for n in walk(module, into_functions=True) if isinstance(n, cst.FunctionDef)]
        frozen: set[str] = set()
        unfrozen: set[str] = set()
        loaders: dict[int, set[str]] = {}  # id(function) -> names it freezes
        for scope in [module, *functions]:
            for name, verdict in _freezing_sites(scope):
                (frozen if verdict else unfrozen).add(name)
                if verdict and isinstance(scope, cst.FunctionDef):
                    loaders.setdefault(id(scope), set()).add(name)
        # `self.model = self._load_model()` where `_load_model` freezes and returns its local `model`
        for fn in functions:
            freezes = loaders.get(id(fn))
            returned = {_model_key(r.value) for r in walk(fn.body) if isinstance(r, cst.Return) and r.value is not None}
            if not freezes or not returned or not returned <= freezes:
                continue
            for assign in walk(module, into_functions=True):
                if isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call) \
                        and _model_key(assign.value.func) == fn.name.value:
                    frozen |= {k for t in assign.targets if (k := _model_key(t.target)) is not None}
        self.names = frozenset(frozen - unfrozen)


def _freezing_sites(scope: cst.CSTNode):
    """(model name, freezes?) for each `requires_grad_` call and parameter loop directly in `scope`."""
    for node in walk(scope):
        if isinstance(node, cst.Call) and _freeze_value(node) is not None and isinstance(node.func, cst.Attribute):
            name = _model_key(node.func.value)
            if name is not None:
                yield name, bool(_freeze_value(node))
        elif isinstance(node, cst.For):
            body = list(node.body.body) if isinstance(node.body, cst.IndentedBlock) else [node.body]
            name, verdict = _parameters_of(node.iter), _loop_freezes(node, body)
            if name is not None and verdict is not None:
                yield name, verdict
        elif isinstance(node, (cst.ListComp, cst.GeneratorExp)) and isinstance(node.elt, cst.Call) \
                and node.for_in.inner_for_in is None and not node.for_in.ifs:
            # `[p.requires_grad_(False) for p in model.parameters()]`
            name, verdict = _parameters_of(node.for_in.iter), _loop_freezes(node.for_in, [cst.Expr(node.elt)])
            if name is not None and verdict is not None:
                yield name, verdict
