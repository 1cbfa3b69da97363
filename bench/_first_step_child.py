"""One process of the first-step bench: start, import, build a workload, compile it, run its first
step; print where the wall time went, as JSON.

    SG_SPAWNED_AT=<time.time() of the spawn> python bench/_first_step_child.py WORKLOAD

The environment (cache dir, store, flag) is set by bench/first_step.py.  Every figure is a wall
clock: the phases are stamped with ``time.time()`` from the spawn on, and each phase's split into
named parts comes from wall timers, exclusive of the parts timed inside them
(``EventLog.timed``): stableguards' own (warm-start load, install, proof, save) and, wrapped here,
torch's Dynamo trace, AOT/inductor compile and C++ build.
"""

from __future__ import annotations

import time

STARTED = time.time()

import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

WORKLOAD = sys.argv[1]
TRANSFORMERS = WORKLOAD != "mlp_train"

import torch  # noqa: E402
import torch._dynamo.utils as dynamo_utils  # noqa: E402

import stableguards  # noqa: E402
from stableguards.events import EVENTS  # noqa: E402

if TRANSFORMERS:
    import transformers  # noqa: F401, E402

import models  # noqa: E402
from _traced import TRACED  # noqa: E402

IMPORTED = time.time()

# The parts of torch's compile, timed where they run.  Each is a function torch looks up by name
# when it calls it, so wrapping the name here times every call.  Only the main thread's time is
# split: it is what the user waits for.  Inductor builds kernels on worker threads while its main
# thread goes on; the wait for them (``AsyncCompile.wait``) is what their build costs the step.
TRACE, BACKEND, BUILD = "Dynamo trace", "AOT/inductor compile", "C++ build"
_PARTS = (("torch._dynamo.convert_frame", "_compile", TRACE),
          ("torch._dynamo.output_graph", "OutputGraph.call_user_compiler", BACKEND),
          ("torch._inductor.compile_fx", "_compile_fx_inner", BACKEND),
          ("torch._inductor.cpp_builder", "CppBuilder.build", BUILD),
          ("torch._inductor.async_compile", "AsyncCompile.wait", BUILD))
STEP = "the step itself"


def _time_parts() -> None:
    import importlib

    for module, name, part in _PARTS:
        owner = importlib.import_module(module)
        *path, attr = name.split(".")
        for step in path:
            owner = getattr(owner, step)
        original = getattr(owner, attr)

        def timed(*args, __original=original, __part=part, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return __original(*args, **kwargs)
            with EVENTS.timed(__part):
                return __original(*args, **kwargs)

        setattr(owner, attr, timed)


def mlp_train():
    """A training step of an MLP: forward, backward, SGD step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step, (torch.randn(16, 64, generator=torch.Generator().manual_seed(0)),), model


def infer(build):
    def workload():
        torch.manual_seed(0)
        model = build().eval()

        def step(ids):
            with torch.no_grad():
                return model(ids).logits
        return step, (models.ids(8),), model
    return workload


def train(build):
    """A training step of a transformers model: loss, backward, SGD step (dropout off)."""
    def workload():
        torch.manual_seed(0)
        model = build().train()
        return models.train_step(model, torch.optim.SGD), (models.ids(8),), model
    return workload


WORKLOADS = {"mlp_train": mlp_train, "gpt2": infer(models.gpt2), "llama": infer(models.llama),
             "gpt2_train": train(models.gpt2)}
# A model at another size: MODEL:LAYERS:HIDDEN (gpt2:12:768 is GPT-2 small), inference.
if WORKLOAD.count(":") == 2:
    _model, _layers, _hidden = WORKLOAD.split(":")
    WORKLOADS[WORKLOAD] = infer(lambda: getattr(models, _model)(int(_layers), int(_hidden)))


def _parts() -> dict[str, float]:
    return dict(EVENTS.seconds)


def _since(before: dict[str, float]) -> dict[str, float]:
    return {name: round(s - before.get(name, 0.0), 4) for name, s in EVENTS.seconds.items()
            if s - before.get(name, 0.0) > 0}


def _result(step, args, model) -> list[torch.Tensor]:
    out = step(*args)
    return [out.detach().clone(), *(p.detach().clone() for p in model.parameters())]


def _per_call_us(compiled, args, calls: int) -> float | None:
    """Microseconds a call of the compiled step takes once compiled (guards, the step), the
    fastest of 5 batches of ``calls`` / 5 (the machine is shared and noisy); None for 0 calls."""
    if not calls:
        return None
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(max(1, calls // 5)):
            compiled(*args)
        batches.append((time.perf_counter() - start) / max(1, calls // 5) * 1e6)
    return min(batches)


def main() -> dict:
    spawned = float(os.environ.get("SG_SPAWNED_AT", STARTED))
    _time_parts()
    step, args, model = WORKLOADS[WORKLOAD]()
    built = time.time()
    # Each phase's parts, exclusive: what the phase took beyond them is "other".
    before = _parts()
    compiled = torch.compile(step)
    compile_returned = time.time()
    in_compile = _since(before)
    before = _parts()
    first = _result(compiled, args, model)
    first_done = time.time()
    in_first = _since(before)
    # The step itself: the same call again, compiled by now.
    gc.collect()
    start = time.perf_counter()
    compiled(*args)
    step_s = time.perf_counter() - start
    frames = len(TRACED)
    per_call_us = _per_call_us(compiled, args, int(os.environ.get("SG_STEADY_CALLS", "0")))
    torch.manual_seed(0)
    eager_step, eager_args, eager_model = WORKLOADS[WORKLOAD]()
    expected = _result(eager_step, eager_args, eager_model)
    ok = all(torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(first, expected, strict=True))
    unnamed = first_done - compile_returned - sum(in_first.values())
    in_first = {**in_first, STEP: round(max(0.0, min(step_s, unnamed)), 4)}
    inductor, aot = dynamo_utils.counters["inductor"], dynamo_utils.counters["aot_autograd"]
    return {
        "wall_s": first_done - spawned,
        "phases": {"start": STARTED - spawned, "import": IMPORTED - STARTED, "build": built - IMPORTED,
                   "torch.compile()": compile_returned - built, "first step": first_done - compile_returned},
        "parts": {"torch.compile()": in_compile, "first step": in_first},
        "frames": frames, "ok": ok, "per_call_us": per_call_us,
        "fx": [inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_bypass"]],
        "aot": [aot["autograd_cache_hit"], aot["autograd_cache_miss"], aot["autograd_cache_bypass"]],
        "counters": dict(stableguards.EVENTS.counters),
        "explain": stableguards.explain() if torch._dynamo.config.stable_guards else "",
    }


if __name__ == "__main__":
    print(json.dumps(main()))
