from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import HotKind, call_arg
from gpulint.builders import add_keyword
from gpulint.program import mentions
from gpulint.semantic.placement import HOST, NONTENSOR, Placement

# a program that switched validation off globally, or runs with assertions off (`python -O` turns the default off)
_GLOBAL_OFF = re.compile(r"set_default_validate_args\(\s*False\s*\)")
_PER_STEP = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION, HotKind.ROLLOUT, HotKind.FORWARD, HotKind.CALLEE,
             HotKind.COMPILED)


class DistributionValidationInStep(Rule):
    """
    ## What it does
    Finds `torch.distributions` objects (`Categorical(logits=...)`, `Normal(mu, std)`, `Bernoulli(...)`, ...)
    built on every training step, rollout step or `forward` without `validate_args=`, in a program that uses
    CUDA and never switches validation off globally (`Distribution.set_default_validate_args(False)`).

    ## Why is this slow
    Argument validation is on by default (it follows `__debug__`). Each construction checks every parameter
    against its constraint (`constraint.check(value).all()`, then `if not valid: raise`), and each
    `log_prob(value)` checks the value against the support the same way. On a CUDA tensor each such check is
    a host read: the host waits until the GPU has finished all queued work, once per distribution built and
    once per `log_prob`, so a PPO update that builds its policy distribution per minibatch synchronizes
    several times per step; on the CPU the checks are extra kernels and Python work on every rollout step.

    ## Example
    ```python
    for idx in minibatches:
        dist = Categorical(logits=actor(obs[idx]))
        loss = -(dist.log_prob(actions[idx]) * adv[idx]).mean()
    ```

    ## Use instead
    ```python
    for idx in minibatches:
        dist = Categorical(logits=actor(obs[idx]), validate_args=False)
        loss = -(dist.log_prob(actions[idx]) * adv[idx]).mean()
    ```
    or once at start-up: `torch.distributions.Distribution.set_default_validate_args(False)`.

    ## Fix safety
    Unsafe: the values are unchanged, but invalid parameters (NaN logits, a negative scale, a probability
    outside [0, 1]) or out-of-support samples no longer raise at the construction or at `log_prob`; they
    propagate as NaN instead. Keep validation on while debugging a new model.
    """

    code = "GPU075"
    name = "distribution-validation-in-step"
    message = ("`torch.distributions` object built every step with argument validation on: each construction "
               "and `log_prob` checks its arguments on the host (a GPU sync per check on CUDA)")
    fix_title = "Pass `validate_args=False`"
    severity = Severity.INFO
    safety = Safety.UNSAFE
    priority = "P2"
    triggers = ("distributions",)
    examples = [
        Invalid(
            """
            import torch
            from torch.distributions import Categorical
            actor = Actor().cuda()
            for obs, actions, adv in loader:
                dist = Categorical(logits=actor(obs.cuda()))
                loss = -(dist.log_prob(actions.cuda()) * adv.cuda()).mean()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            from torch.distributions import Categorical
            actor = Actor().cuda()
            for obs, actions, adv in loader:
                dist = Categorical(logits=actor(obs.cuda()), validate_args=False)
                loss = -(dist.log_prob(actions.cuda()) * adv.cuda()).mean()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # through the module, in a rollout loop
            """
            import torch
            import torch.distributions as D
            policy = Policy().to("cuda")
            for t in range(horizon):
                mu, std = policy(obs)
                action = D.Normal(mu, std).sample()
                obs, reward, done, info = env.step(action.cpu().numpy())
            """,
            fixed="""
            import torch
            import torch.distributions as D
            policy = Policy().to("cuda")
            for t in range(horizon):
                mu, std = policy(obs)
                action = D.Normal(mu, std, validate_args=False).sample()
                obs, reward, done, info = env.step(action.cpu().numpy())
            """,
        ),
        Valid(  # `Independent` around a distribution built with validation off: it checks nothing of its own
            """
            import torch
            from torch.distributions import Independent, Normal
            model = Net().cuda()
            for x, y in loader:
                mean, std = model(x.cuda())
                dist = Independent(Normal(mean, std, validate_args=False), 1)
                (-dist.log_prob(y.cuda()).mean()).backward()
                optimizer.step()
            """
        ),
        Valid(  # validation chosen explicitly
            """
            import torch
            from torch.distributions import Categorical
            model = Net().cuda()
            for x, y in loader:
                dist = Categorical(logits=model(x.cuda()), validate_args=True)
                (-dist.log_prob(y.cuda()).mean()).backward()
                optimizer.step()
            """
        ),
        Valid(  # a standard normal from Python numbers: CPU parameters, its checks read nothing back
            """
            import torch
            from torch.distributions import Normal
            actor = Actor().cuda()
            for x, y in loader:
                mu, sigma = actor(x.cuda())
                z = Normal(0, 1).sample(mu.shape).to(mu.device)
                (mu + sigma * z).pow(2).mean().backward()
                optimizer.step()
            """
        ),
        Valid(  # switched off for the whole program
            """
            import torch
            from torch.distributions import Categorical, Distribution
            Distribution.set_default_validate_args(False)
            model = Net().cuda()
            for x, y in loader:
                dist = Categorical(logits=model(x.cuda()))
                (-dist.log_prob(y.cuda()).mean()).backward()
                optimizer.step()
            """
        ),
        Valid(  # built once, outside the step
            """
            import torch
            prior = torch.distributions.Normal(torch.zeros(8, device="cuda"), torch.ones(8, device="cuda"))
            for x in loader:
                loss = -prior.log_prob(model(x.cuda())).sum()
                loss.backward()
                optimizer.step()
            """
        ),
    ]
    # the values are the same; SYNC counts the host reads the validation makes
    micro_check = MicroCheck(
        kinds=("EQ", "SYNC", "PERF"),
        setup="logits = torch.randn(256, 6)\nactions = torch.randint(0, 6, (256,))",
        before=("dist = torch.distributions.Categorical(logits=logits)\n"
                "logp = dist.log_prob(actions)\nent = dist.entropy()"),
        after=("dist = torch.distributions.Categorical(logits=logits, validate_args=False)\n"
               "logp = dist.log_prob(actions)\nent = dist.entropy()"),
        compare=("logp", "ent"),
    )

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        super().__init__(ctx)
        self._switched_off: bool | None = None

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.analysis.call_qualname(node) or ""
        parts = qual.split(".")
        if len(parts) < 3 or parts[:2] != ["torch", "distributions"] or not parts[-1][:1].isupper():
            return
        if parts[-1] in ("Distribution", "ExponentialFamily", "Independent"):
            return  # base classes; `Independent` checks nothing of its own (no arg_constraints, its `log_prob` is
            # the base distribution's, which is reported where that is built)
        if call_arg(node, "validate_args") is not None or any(a.star for a in node.args):
            return  # chosen explicitly, or passed through **kwargs
        if self.ctx.hot_kind() not in _PER_STEP or self.ctx.in_test_code():
            return
        if self._switched_off is None:  # once per file: the program's texts as read
            self._switched_off = any(mentions(_GLOBAL_OFF, text) for text in self.ctx.program.sources.values()) \
                or bool(_GLOBAL_OFF.search(self.ctx.program.sources.get(self.ctx.path) or self.ctx.module.code))
        if self._switched_off:
            return
        if not self.ctx.targets_cuda():
            return
        placement = Placement(self.ctx)
        if all(placement.of(arg.value) in (NONTENSOR, HOST) for arg in node.args):
            return  # `Normal(0, 1)`: parameters made from Python numbers live on the CPU, checking them syncs nothing
        self.report(node, replacement=add_keyword(node, "validate_args", "False"))
