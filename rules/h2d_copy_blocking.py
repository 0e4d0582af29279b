import re

import libcst as cst

from gpulint import Device, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, dotted_name, has_star_args, legacy_sized_allocation, method_name, walk
from gpulint.builders import add_keyword
from gpulint.rule import is_test_path
from gpulint.semantic.placement import READ_BACK_METHODS, TENSOR, Placement, amortised, at_episode_end

_DTYPE_NAME = re.compile(r"(^|[._])dtype$")


# batches drawn from a generator cycling over the loader (an example, before its fix)
_CYCLED_LOADER = """
            import torch

            def infiniteloop(dataloader):
                while True:
                    for x, y in iter(dataloader):
                        yield x

            loader = torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True, num_workers=4)
            datalooper = infiniteloop(loader)
            for step in range(800000):
                optimizer.zero_grad()
                x_0 = next(datalooper).to(device)
                trainer(x_0).mean().backward()
                optimizer.step()
            """


class H2dCopyBlocking(Rule):
    """
    ## What it does
    Finds host-to-device copies of host data (`batch.to(device)`, `x.cuda()`) in the training step that do
    not pass `non_blocking=True`. It fires only with evidence that the source is host memory (a DataLoader
    batch, `torch.from_numpy`, a tensor built on the CPU) and that the target is not the CPU. A `forward`
    decorated `@torch.no_grad()` / `@torch.inference_mode()` is inference code and is not reported.

    ## Why is this slow
    A blocking copy makes the host wait for the transfer (a `cudaStreamSynchronize` per copy), so the CPU
    stops queueing kernels. With `non_blocking=True` the copy is queued on the current stream, which already
    orders it before the kernels that use it. Measured on an H100: 1000 small copies 12.95 ms -> 7.68 ms;
    from pinned memory 64 MiB takes 1.22 ms instead of 5.10 ms (pair with `pin_memory=True`, GPU010).

    ## Example
    ```python
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        ...
    ```

    ## Fix safety
    Safe under the rule's guards: host-to-device copies on the current stream are ordered before later
    kernels, and a CPU-to-CPU `non_blocking=True` is a no-op. The rule never fires when the target may be the
    CPU and the source may be a CUDA tensor (device-to-host non-blocking copies need an explicit sync,
    GPU012), nor for copies outside the training step.
    """

    code = "GPU011"
    name = "h2d-copy-blocking"
    message = "Host-to-device copy in the training step blocks the host; pass `non_blocking=True`"
    fix_title = "Add `non_blocking=True`"
    severity = Severity.WARNING
    safety = Safety.SAFE
    priority = "P1"
    triggers = (".to(", ".cuda(", ".type(")
    examples = [
        Valid(  # read back on the next line: the host waits for the copied data anyway, nothing to overlap
            """
            import numpy as np
            import torch
            for step, batch in enumerate(loader):
                loss = model(batch.to("cuda", non_blocking=True)).mean()
                loss.backward()
                optimizer.step()
                predicted = torch.from_numpy(np.array(values)).to("cuda")
                priorities = (predicted - target).abs().cpu().numpy()
            """
        ),
        Valid(  # an inference wrapper: its forward runs under no_grad, never in a training step
            """
            import numpy as np
            import torch
            class Predictor(torch.nn.Module):
                @torch.no_grad()
                def forward(self, images):
                    batch = torch.from_numpy(np.stack(images)).to(self.device)
                    return self.net(batch)
            """
        ),
        Valid(
            """
            for x, y in loader:
                x = x.to(device, non_blocking=True)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # outside the training step: one-off copy
            """
            x = torch.from_numpy(arr).to("cuda")
            """
        ),
        Valid(  # target may be the CPU and the source is not host data: direction unknown
            """
            for x in loader:
                out = model(x)
                h = out.to(target_device)
                out.sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # a literal constant and `as_tensor` of a value that may already be a CUDA tensor: not batches
            """
            import torch
            for x, y in loader:
                logits = model(x.cuda(non_blocking=True))
                loss = torch.tensor(0).to(logits) if y is None else criterion(logits, y)
                sigma = torch.as_tensor(noise_level(logits)).to(logits.device)
                (loss * sigma).backward()
                optimizer.step()
            """
        ),
        Valid(  # a cast to a dtype held in a variable; a loop that takes one batch and stops
            """
            import torch
            half = torch.bfloat16
            for x, y in loader:
                x, y = x.to(half), y.to(dtype)
                out = model(x.cuda(non_blocking=True))
                out.sum().backward()
                optimizer.step()
            for x, y in loader:
                x = x.to(device)
                model(x).sum().backward()
                optimizer.step()
                break
            """
        ),
        Valid(  # explicit CPU target
            """
            for x, y in loader:
                x = x.to("cpu")
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            for x, y in train_loader:
                x, y = x.to(device), y.cuda()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            for x, y in train_loader:
                x, y = x.to(device, non_blocking=True), y.cuda(non_blocking=True)
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the loop iterates the loader through a progress bar chosen by a conditional expression
            """
            import torch
            from torch.utils.data import DataLoader
            def run_epoch(model, data, optimizer, device, is_train):
                loader = DataLoader(data, shuffle=True, pin_memory=True, batch_size=64, num_workers=4)
                pbar = tqdm(enumerate(loader), total=len(loader)) if is_train else enumerate(loader)
                for it, (x, y) in pbar:
                    x = x.to(device)  # error: GPU011
                    loss = torch.nn.functional.cross_entropy(model(x), y.to(device))  # error: GPU011
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            def run_epoch(model, data, optimizer, device, is_train):
                loader = DataLoader(data, shuffle=True, pin_memory=True, batch_size=64, num_workers=4)
                pbar = tqdm(enumerate(loader), total=len(loader)) if is_train else enumerate(loader)
                for it, (x, y) in pbar:
                    x = x.to(device, non_blocking=True)  # error: GPU011
                    loss = torch.nn.functional.cross_entropy(model(x), y.to(device, non_blocking=True))  # error: GPU011
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # batches drawn from a generator that cycles over the loader
            _CYCLED_LOADER,
            fixed=_CYCLED_LOADER.replace("next(datalooper).to(device)", "next(datalooper).to(device, non_blocking=True)"),
        ),
        Invalid(  # a contrastive batch: the loader's views concatenated on the host, then copied
            """
            import torch
            for views, _ in train_loader:
                images = torch.cat(views, dim=0)
                images = images.to(device)
                model(images).mean().backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            for views, _ in train_loader:
                images = torch.cat(views, dim=0)
                images = images.to(device, non_blocking=True)
                model(images).mean().backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=64)
            for step, batch in enumerate(loader):
                images = batch["image"].to("cuda")
                model(images).mean().backward()
                opt.step()
            """,
            fixed="""
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=64)
            for step, batch in enumerate(loader):
                images = batch["image"].to("cuda", non_blocking=True)
                model(images).mean().backward()
                opt.step()
            """,
        ),
        Invalid(  # a legacy CPU type (`torch.FloatTensor`) makes a host tensor of whatever the replay returns
            """
            import torch
            def update(memory, device):
                states, targets = memory.sample(256)
                states = torch.FloatTensor(states).to(device)
                targets = torch.FloatTensor(targets).to(device)
                loss = (critic(states) - targets).pow(2).mean()
                loss.backward()
                critic_optim.step()
            """,
            fixed="""
            import torch
            def update(memory, device):
                states, targets = memory.sample(256)
                states = torch.FloatTensor(states).to(device, non_blocking=True)
                targets = torch.FloatTensor(targets).to(device, non_blocking=True)
                loss = (critic(states) - targets).pow(2).mean()
                loss.backward()
                critic_optim.step()
            """,
        ),
        Invalid(  # batch tensors cast in place (`x, y = x.float(), y.float()`), then moved when CUDA is there
            """
            import torch
            def fit(net, loader, opt):
                use_gpu = torch.cuda.is_available()
                for boards, targets in loader:
                    boards, targets = boards.float(), targets.float()
                    if use_gpu:
                        boards, targets = boards.cuda(), targets.cuda()
                    ((net(boards) - targets) ** 2).mean().backward()
                    opt.step()
            """,
            fixed="""
            import torch
            def fit(net, loader, opt):
                use_gpu = torch.cuda.is_available()
                for boards, targets in loader:
                    boards, targets = boards.float(), targets.float()
                    if use_gpu:
                        boards, targets = boards.cuda(non_blocking=True), targets.cuda(non_blocking=True)
                    ((net(boards) - targets) ** 2).mean().backward()
                    opt.step()
            """,
        ),
        Invalid(  # each tensor of a batch read with `next()` from an iterator over the loader
            """
            import torch
            data_iter = iter(train_loader)
            while True:
                batch = next(data_iter)
                x, y = [t.to(device) for t in batch]
                criterion(model(x), y).backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            data_iter = iter(train_loader)
            while True:
                batch = next(data_iter)
                x, y = [t.to(device, non_blocking=True) for t in batch]
                criterion(model(x), y).backward()
                optimizer.step()
            """,
        ),
        Invalid(  # loaders reached through a helper, a dict of phases and the legacy Variable wrapper
            """
            from torch.autograd import Variable
            from torch.utils.data import DataLoader
            def make_loader(ds):
                return DataLoader(ds, batch_size=64, shuffle=True)
            loaders = {"train": make_loader(train_set), "val": make_loader(val_set)}
            for x, y in tqdm(loaders["train"]):
                x = Variable(x, requires_grad=True).to(device)
                criterion(model(x), y.cuda()).backward()
                optimizer.step()
            """,
            fixed="""
            from torch.autograd import Variable
            from torch.utils.data import DataLoader
            def make_loader(ds):
                return DataLoader(ds, batch_size=64, shuffle=True)
            loaders = {"train": make_loader(train_set), "val": make_loader(val_set)}
            for x, y in tqdm(loaders["train"]):
                x = Variable(x, requires_grad=True).to(device, non_blocking=True)
                criterion(model(x), y.cuda(non_blocking=True)).backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the legacy spelling: a cast to a CUDA tensor type is a copy to the GPU
            """
            import torch
            cuda = torch.cuda.is_available()
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            for imgs, _ in dataloader:
                real_imgs = imgs.type(Tensor)
                loss = discriminator(real_imgs).mean()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            cuda = torch.cuda.is_available()
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            for imgs, _ in dataloader:
                real_imgs = imgs.type(Tensor, non_blocking=True)
                loss = discriminator(real_imgs).mean()
                loss.backward()
                optimizer.step()
            """,
        ),
        Valid(  # a cast to a CPU tensor type copies nothing to the GPU
            """
            import torch
            for imgs, _ in dataloader:
                loss = discriminator(imgs.type(torch.FloatTensor).cuda(non_blocking=True)).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # a helper the step loop hands each batch to (in any file of the program)
            """
            import torch
            def loss_of(x, y, model, device):
                x, y = x.to(device), y.to(device)
                return torch.nn.functional.cross_entropy(model(x), y)
            def train(model, loader, opt, device):
                for x, y in loader:
                    loss_of(x, y, model, device).backward()
                    opt.step()
            """,
            fixed="""
            import torch
            def loss_of(x, y, model, device):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                return torch.nn.functional.cross_entropy(model(x), y)
            def train(model, loader, opt, device):
                for x, y in loader:
                    loss_of(x, y, model, device).backward()
                    opt.step()
            """,
        ),
        Valid(  # the loader's collate function already moves each batch to the device
            """
            import torch
            from functools import partial
            def collate(items, device):
                return torch.stack(items).to(device)
            def loss_of(x, model, device):
                return model(x.to(device)).mean()
            loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=partial(collate, device="cuda"))
            for x in loader:
                loss_of(x, model, "cuda").backward()
                opt.step()
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup="x = torch.randn(64, 128, device='cpu')",
        before="y = x.to(device)\nz = (y * 2).sum()",
        after="y = x.to(device, non_blocking=True)\nz = (y * 2).sum()",
        compare=("y", "z"),
        # 200 pinned 1 MiB batches, as a DataLoader with pin_memory=True yields them
        options={"perf_setup": "xs = [torch.randn(256, 1024, device='cpu').pin_memory() for _ in range(200)]",
                 "perf_before": "ys = [x.to(device) for x in xs]",
                 "perf_after": "ys = [x.to(device, non_blocking=True) for x in xs]"},
    )

    def _cuda_tensor_type(self, call: cst.Call) -> bool:
        """`.type(torch.cuda.FloatTensor)`, or `.type(Tensor)` with `Tensor = torch.cuda.FloatTensor if cuda else
        torch.FloatTensor`: a CUDA tensor type (on a machine with a GPU)."""
        target = call_arg(call, "dtype", 0)
        if target is None:
            return False
        value = target.value
        if isinstance(value, cst.Name):
            bindings = self.ctx.analysis.reaching_bindings(value.value, self.ctx.ancestors)
            if len(bindings) != 1 or bindings[0].value is None:
                return False
            value = bindings[0].value
        if isinstance(value, cst.IfExp):
            return _cuda_type_name(self.ctx.qualname(value.body) or "")
        return _cuda_type_name(self.ctx.qualname(value) or "")

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        if name not in ("to", "cuda", "type") or has_star_args(node) or call_arg(node, "non_blocking") is not None:
            return
        if name == "type" and not self._cuda_tensor_type(node):
            return
        if not self.ctx.in_hot_region() or is_test_path(self.ctx.path) or self.ctx.in_no_grad_function() \
                or amortised(self.ctx) or at_episode_end(self.ctx):
            return  # an inference-only forward (`@torch.no_grad()`), or a validation pass every N steps
        assert isinstance(node.func, cst.Attribute)
        evidence = self.ctx.evidence
        source = node.func.value
        if not evidence.is_cpu_source(source) or isinstance(source, cst.Call) and legacy_sized_allocation(
                source, self.ctx.qualname(source.func) or ""):
            return  # an uninitialized `torch.FloatTensor(n, d)` has nothing to copy: GPU015 allocates it on the device
        if name == "type":
            pass  # a CUDA tensor type (`imgs.type(torch.cuda.FloatTensor)`): a copy to the GPU
        elif name == "to":
            target = call_arg(node, "device", 0)
            positional = [a for a in node.args if a.keyword is None]
            if target is None or len(positional) > 2:
                return  # no visible device, or the positional (device, dtype, non_blocking) form
            qualified = self.ctx.qualname(target.value) or ""
            if qualified.startswith("torch.") or _DTYPE_NAME.search(dotted_name(target.value) or "") \
                    or Placement(self.ctx).device_kind(target.value) == TENSOR:
                return  # `.to(torch.float16)`, `.to(dtype)`, `.to(half)` with `half = torch.bfloat16`: a cast
            if evidence.device_of(target.value) is Device.CPU or _names_cpu(target.value):
                return
        if self._read_back_next(node):
            return  # the host waits for the copied data a statement later: nothing to overlap
        self.report(node, replacement=add_keyword(node, "non_blocking", "True"))

    def _read_back_next(self, node: cst.Call) -> bool:
        """`x = torch.from_numpy(a).to(d)` followed, within the next two statements, by a read back to the host of
        something computed from `x` (`loss_fn(x, y).cpu().numpy()`)."""
        ancestors = self.ctx.ancestors
        index = next((i for i in range(len(ancestors) - 1, -1, -1)
                      if isinstance(ancestors[i], cst.SimpleStatementLine)), None)
        if index is None or index == 0 or not isinstance(ancestors[index - 1], cst.IndentedBlock):
            return False
        statement, block = ancestors[index], ancestors[index - 1]
        assigned = {target.target.value for small in statement.body if isinstance(small, cst.Assign)
                    for target in small.targets if isinstance(target.target, cst.Name)}
        if not assigned:
            return False
        position = next(i for i, s in enumerate(block.body) if s is statement)
        for following in block.body[position + 1:position + 3]:
            for call in walk(following):
                if isinstance(call, cst.Call) and method_name(call) in READ_BACK_METHODS \
                        and isinstance(call.func, cst.Attribute) and any(
                            isinstance(n, cst.Name) and n.value in assigned for n in walk(call.func.value)):
                    return True
        return False


def _cuda_type_name(qualified: str) -> bool:
    return qualified.startswith("torch.cuda.") and qualified.endswith("Tensor")


def _names_cpu(node: cst.BaseExpression) -> bool:
    """A device variable whose name says CPU (`cpu_device`, `self.host`) is never a copy target we touch."""
    text = (getattr(node, "value", None) if isinstance(node, cst.Name) else
            node.attr.value if isinstance(node, cst.Attribute) else "") or ""
    return "cpu" in text.lower() or "host" in text.lower()
