"""One rank of a distributed training job on gloo (CPU), for bench/distributed.py and the
distributed tests: a 4-block transformer stack wrapped as each setting says, compiled, trained
a few optimizer steps, and compared with the same wrapped model run uncompiled.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p \\
        python bench/_distributed_child.py [--small] BACKEND SETTING [SETTING ...]

``--small``: 2 blocks of width 32 (the tests').  ``SG_BUCKET_MB`` sets DDP's bucket cap (1),
``SG_MESH_DP`` the dp dim of fsdp2_tp's mesh (1: 1 x world).  Settings run one after another in one
process group (``torch._dynamo.reset()`` between them):
single, ddp_plain (``optimize_ddp=False``), ddp (DDPOptimizer), fsdp2, tp, collectives; and
fsdp2_keep (``reshard_after_forward=False``), fsdp2_mp (bf16 parameters, fp32 reductions),
fsdp2_tp (FSDP2 over a 1 x world mesh's dp dim, tensor parallel over its tp dim), fsdp2_ac
(each block's forward under activation checkpointing), ddp_optim (``optimize_ddp=False``
and the optimizer step compiled too).
Prints one JSON line: per setting, the frames Dynamo traced (by code name), the FX-graph and
AOTAutograd cache counters, the wall seconds from ``torch.compile()`` to the first finished
step, whether every step's loss and the final parameters equal the uncompiled run's; and
explain().
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.checkpoint

import stableguards  # noqa: F401 - installs the flag's machinery
from _traced import names as traced

DIM, HEADS, BLOCKS, STEPS = 128, 4, 4, 3


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.out = (torch.nn.Linear(DIM, DIM) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(DIM, 2 * DIM), torch.nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.ln1(x)
        # -1 heads: under tensor parallel each rank holds a slice of them.
        q, k, v = (p(h).view(b, s, -1, DIM // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.out(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean()


def _ddp(model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    # 1 MB (DDPOptimizer's smallest: its first bucket's cap): several buckets, several graphs.
    return DistributedDataParallel(model, bucket_cap_mb=float(os.environ.get("SG_BUCKET_MB", "1")))


class Checkpointed(Block):
    """A block whose forward runs under activation checkpointing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)


def _fsdp2(model: Stack, mesh: object = None, **options: object) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    return fully_shard(model, mesh=mesh, **options)


def _mixed(model: Stack) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return _fsdp2(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))


def _checkpointed(model: Stack) -> torch.nn.Module:
    for block in model.blocks:
        block.__class__ = Checkpointed
    return _fsdp2(model)


def _tp(model: Stack, mesh: object = None) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = mesh or init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "out": RowwiseParallel(),
            "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    return model


def _fsdp2_tp(model: Stack) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh

    dp = int(os.environ.get("SG_MESH_DP", "1"))  # the dp dim's size; tp takes the rest
    mesh = init_device_mesh("cpu", (dp, dist.get_world_size() // dp), mesh_dim_names=("dp", "tp"))
    return _fsdp2(_tp(model, mesh["tp"]), mesh["dp"])


WRAPS: dict[str, Callable[[Stack], torch.nn.Module]] = {
    "single": lambda m: m, "ddp_plain": _ddp, "ddp": _ddp, "ddp_optim": _ddp, "fsdp2": _fsdp2, "tp": _tp,
    "fsdp2_keep": lambda m: _fsdp2(m, reshard_after_forward=False), "fsdp2_mp": _mixed, "fsdp2_tp": _fsdp2_tp,
    "fsdp2_ac": _checkpointed,
}
# Every rank its own batch, except where the model is split by features (one batch).
ONE_BATCH = ("tp", "fsdp2_tp")
# bf16 parameters: compiled and uncompiled round differently.
TOLERANCE = {"fsdp2_mp": 2e-2}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {f"{group}.{name}": n for group in ("inductor", "aot_autograd") for name, n in counters[group].items()
            if "cache" in name}


def _train(setting: str, backend: str) -> dict:
    torch.manual_seed(0)
    base = Stack()
    # Every rank its own batch, except under tensor parallel (one batch, split by features).
    seed = 100 if setting in ONE_BATCH else 100 + dist.get_rank()
    batches = [torch.randn(2, 8, DIM, generator=torch.Generator().manual_seed(seed + i)) for i in range(STEPS)]
    results = {}
    for compiled in (False, True):
        model = WRAPS[setting](copy.deepcopy(base))
        # SGD with momentum: Adam's normalized step turns a rounding difference in a tiny gradient
        # into a whole step.  foreach needs every parameter a DTensor or none (tensor parallel
        # leaves norms and head plain).
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=setting not in ONE_BATCH)
        start = time.perf_counter()
        run = torch.compile(model, backend=backend) if compiled else model
        step = torch.compile(optimizer.step, backend=backend) if compiled and setting == "ddp_optim" else optimizer.step
        losses, first = [], 0.0
        for i, x in enumerate(batches):
            loss = run(x)
            loss.backward()
            step()
            optimizer.zero_grad()
            losses.append(loss.item())
            if i == 0:
                first = time.perf_counter() - start
        results[compiled] = (losses, [_local(p).detach().clone() for p in model.parameters()], first)
    (eager_losses, eager_params, _), (losses, params, first) = results[False], results[True]
    tol = TOLERANCE.get(setting, 1e-4)
    ok = (torch.allclose(torch.tensor(losses), torch.tensor(eager_losses), rtol=tol, atol=tol / 10)
          and all(torch.allclose(a, b, rtol=tol, atol=tol / 10) for a, b in zip(params, eager_params, strict=True)))
    return {"ok": ok, "first_step_s": first}


def collective_step(x: torch.Tensor) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    y = funcol.all_reduce(x.sin(), "sum", dist.group.WORLD)
    dist.all_reduce(y)
    return y.cos() * dist.get_world_size()


def _collectives(backend: str) -> dict:
    x = torch.randn(8, generator=torch.Generator().manual_seed(dist.get_rank()))
    start = time.perf_counter()
    got = torch.compile(collective_step, backend=backend)(x)
    first = time.perf_counter() - start
    return {"ok": bool(torch.allclose(got, collective_step(x.clone()), rtol=1e-4, atol=1e-5)), "first_step_s": first}


def main(backend: str, settings: list[str]) -> dict:
    from torch._inductor import compile_fx  # noqa: F401 - importing inductor is left out of the timings

    dist.init_process_group("gloo")
    report = {}
    for setting in settings:
        torch._dynamo.reset()
        before_frames, before = len(traced()), _counters()
        with torch._dynamo.config.patch(optimize_ddp=setting not in ("ddp_plain", "ddp_optim")):
            result = _collectives(backend) if setting == "collectives" else _train(setting, backend)
        after = _counters()
        result["traced"] = traced()[before_frames:]
        result["counters"] = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
        report[setting] = result
        dist.barrier()
    dist.destroy_process_group()
    return {"settings": report, "explain": stableguards.explain()}


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--small":
        DIM, BLOCKS, args = 32, 2, args[1:]
    print(json.dumps(main(args[0], args[1:])))
