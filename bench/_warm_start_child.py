"""One process of the warm-start bench: compile a workload, run its calls, print timings as JSON.

    python bench/_warm_start_child.py WORKLOAD

The environment (cache dir, flag) is set by bench/warm_start.py.
"""

from __future__ import annotations

import copy
import gc
import json
import sys
import time
from pathlib import Path

import torch
import torch._dynamo.utils as dynamo_utils

import stableguards

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _traced import TRACED  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

# Per-call overhead: calls timed after everything is compiled (guards + launch).
OVERHEAD_CALLS = 300
OVERHEAD_BATCHES = 9


class Encoder(torch.nn.Module):
    """A small transformer encoder (forward only, no grad)."""

    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True,
                                                 dropout=0.0)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).mean(dim=1)


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def transformer() -> tuple:
    torch.manual_seed(0)
    model = Encoder().eval()
    inputs = [(torch.randn(4, 12, 32),) for _ in range(3)]

    def run(compiled, args):
        with torch.no_grad():
            return compiled(*args)

    return model, inputs, run


def parametrized() -> tuple:
    """An MLP whose weights are weight-normalized (``parametrizations.weight_norm``, as audio
    models have them): ``register_parametrization`` makes each layer's class at run time."""
    torch.manual_seed(0)
    model = Mlp().eval()
    for layer in (model.net[0], model.net[2]):
        torch.nn.utils.parametrizations.weight_norm(layer)
    inputs = [(torch.randn(4, 16),) for _ in range(3)]

    def run(compiled, args):
        with torch.no_grad():
            return compiled(*args)

    return model, inputs, run


class ChunkedFeedForward(torch.nn.Module):
    """BERT's ``chunk_size_feed_forward``: the sequence is cut into S // 4 chunks, which
    pins S; automatic dynamic shapes mark S dynamic after it varies."""

    def __init__(self) -> None:
        super().__init__()
        self.ff = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = x.chunk(x.shape[1] // 4, dim=1)
        return torch.cat([self.ff(c) for c in chunks], dim=1)


def chunk_ff() -> tuple:
    torch.manual_seed(0)
    model = ChunkedFeedForward().eval()
    inputs = [(torch.randn(2, s, 32),) for s in (8, 12, 16, 12)]

    def run(compiled, args):
        with torch.no_grad():
            return compiled(*args)

    return model, inputs, run


def train_step() -> tuple:
    """A training step: forward with a graph break (logging the loss) in the compiled
    function, backward after it: two frames, each with a forward and a backward graph."""
    torch.manual_seed(0)
    model = Mlp()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = model(x)
        torch._dynamo.graph_break()
        return torch.nn.functional.mse_loss(hidden.relu(), y)

    inputs = [(torch.randn(8, 16), torch.randn(8, 16)) for _ in range(3)]

    def run(compiled, args):
        model.zero_grad(set_to_none=True)
        loss = compiled(*args)
        loss.backward()
        return torch.cat([loss.detach().reshape(1)] + [p.grad.flatten() for p in model.parameters()])

    return step, inputs, run


def gan_step() -> tuple:
    """A GAN's training step: a generator and a discriminator, each with its own Adam (one
    class, two learning rates), both stepped in one compiled function, so the optimizers'
    shared frames (``Optimizer.step``'s wrapper, Adam's ``step``) have an entry for each.
    The eager run steps copies of both, made the same way."""
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    disc = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def trained(gen: torch.nn.Module, disc: torch.nn.Module) -> tuple:
        return (gen, disc, torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                torch.optim.Adam(disc.parameters(), lr=1e-3, betas=(0.5, 0.999)))

    compiled_set, eager_set = trained(gen, disc), trained(copy.deepcopy(gen), copy.deepcopy(disc))

    def step(gen, disc, opt_gen, opt_disc, real: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        fake = gen(noise)
        loss_disc = (disc(real) - 1).pow(2).mean() + disc(fake.detach()).pow(2).mean()
        opt_disc.zero_grad(set_to_none=True)
        loss_disc.backward()
        opt_disc.step()
        loss_gen = (disc(gen(noise)) - 1).pow(2).mean()
        opt_gen.zero_grad(set_to_none=True)
        loss_gen.backward()
        opt_gen.step()
        return torch.stack([loss_disc.detach(), loss_gen.detach()])

    inputs = [(torch.randn(16, 8), torch.randn(16, 8)) for _ in range(3)]

    def run(fn, args):
        return fn(*(eager_set if fn is step else compiled_set), *args)

    return step, inputs, run


def ab_workload(name: str) -> tuple:
    workload = WORKLOADS[name]
    gen = torch.Generator().manual_seed(0)
    return workload.fn, [workload.make_args(call, gen) for call in workload.calls], lambda c, a: c(*a)


REALISTIC = {"transformer": transformer, "train_step": train_step, "chunk_ff": chunk_ff, "gan_step": gan_step,
             "parametrized": parametrized}


def per_call(run, compiled, args) -> float:
    """us per call of ``compiled`` on ``args``: the fastest batch (the machine is shared and noisy)."""
    batches = []
    for _ in range(OVERHEAD_BATCHES):
        start = time.perf_counter()
        for _ in range(OVERHEAD_CALLS):
            run(compiled, args)
        batches.append((time.perf_counter() - start) / OVERHEAD_CALLS * 1e6)
    return min(batches)


def main(name: str) -> dict:
    fn, inputs, run = REALISTIC[name]() if name in REALISTIC else ab_workload(name)
    # Importing inductor takes 2-3 s here, in every process that compiles for it, cold or
    # warm, flag off or on: it is left out of the timings, which compare what differs.
    import torch._dynamo.backends.common  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401

    # The timed code starts from a collected heap, as timeit's does: a full collection that
    # building the workload left due would otherwise fall into it at random.
    gc.collect()
    start = time.perf_counter()
    compiled = torch.compile(fn)
    outputs = [run(compiled, args) for args in inputs]
    first_s = time.perf_counter() - start
    frames = len(TRACED)  # not counters["frames"], which also counts frames Dynamo skipped or installed
    gc.collect()  # nor one the first calls left due in the steady calls, which are subtracted
    start = time.perf_counter()
    for args in inputs:
        run(compiled, args)
    steady_s = time.perf_counter() - start
    per_call_us = per_call(run, compiled, inputs[-1])
    # The first input's entry: the oldest when several shapes were compiled, the
    # last that a fixed order (newest first) would try.
    per_call_first_us = per_call(run, compiled, inputs[0])
    eager = [run(fn, args) for args in inputs]
    matches = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(outputs, eager, strict=True))
    return {
        "compile_s": first_s - steady_s,  # what the first calls cost beyond running
        "frames": frames,
        "graphs": dynamo_utils.counters["stats"]["unique_graphs"],
        "fx_misses": dynamo_utils.counters["inductor"]["fxgraph_cache_miss"],
        "dynamo_cache_hit": dynamo_utils.counters["dynamo_cache"]["dynamo_cache_hit"],
        "per_call_us": per_call_us,
        "per_call_first_us": per_call_first_us,
        "matches_eager": matches,
        "warm_start": {k: v for k, v in stableguards.EVENTS.counters.items() if k.startswith("warm_start")},
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
