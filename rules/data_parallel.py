from __future__ import annotations

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg

_DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                  "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel",
                  "torch.nn.parallel.data_parallel.data_parallel"}


class DataParallel(Rule):
    """
    ## What it does
    Finds `nn.DataParallel(...)` (and the functional `torch.nn.parallel.data_parallel(...)`).

    ## Why is this slow
    DataParallel drives all GPUs from one Python process: on every forward it re-replicates the model to each
    device, scatters the batch from GPU 0, runs the replicas in threads that contend for the GIL, and gathers
    the outputs back on GPU 0, which also holds all gradients. On 2x H200, ResNet-50 with a global batch of 128
    ran at 1192 img/s with DataParallel, slower than a single GPU (2131 img/s), while
    DistributedDataParallel reached 3610 img/s; a small MLP step went from 1144 µs on one GPU to 4228 µs.
    The DataParallel docstring itself: "It is recommended to use DistributedDataParallel, instead of this
    class, to do multi-GPU training, even if there is only a single node".

    ## Example
    ```python
    model = nn.DataParallel(model).cuda()
    ```

    ## Use instead
    One process per GPU (`torchrun --nproc_per_node=N train.py`):
    ```python
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])
    loader = DataLoader(train_set, batch_size=per_gpu_batch, sampler=DistributedSampler(train_set))
    ```

    ## Fix safety
    No automatic fix: moving to DDP changes how the script is launched, needs a process group, a
    `DistributedSampler` (and `set_epoch` per epoch), per-GPU batch sizes and rank-0-only logging and
    checkpointing.
    """

    code = "GPU060"
    name = "data-parallel"
    message = ("`DataParallel` drives every GPU from one process (replicate, scatter, gather each step); "
               "use `DistributedDataParallel` with one process per GPU")
    severity = Severity.WARNING
    safety = Safety.SUGGEST
    priority = "P1"
    triggers = ("DataParallel", "data_parallel")
    examples = [
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model.cuda(rank), device_ids=[rank])
            if isinstance(model, torch.nn.DataParallel):
                model = model.module
            """
        ),
        Valid(  # a single device: DataParallel just calls the module
            """
            import torch.nn as nn
            model = nn.DataParallel(model, device_ids=[0])
            """
        ),
        Invalid(
            """
            import torch
            net = torch.nn.DataParallel(net)
            """
        ),
        Invalid(
            """
            from torch import nn
            model = nn.DataParallel(model, device_ids=list(range(args.num_gpu))).cuda()
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.analysis.call_qualname(node) not in _DATA_PARALLEL:
            return
        qualname = self.ctx.analysis.call_qualname(node) or ""
        # DataParallel(module, device_ids=None, ...); data_parallel(module, inputs, device_ids=None, ...)
        devices = call_arg(node, "device_ids", 2 if qualname.endswith("data_parallel") else 1)
        if devices is not None and isinstance(devices.value, (cst.List, cst.Tuple)) and len(devices.value.elements) == 1:
            return
        self.report(node)
