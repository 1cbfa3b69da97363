"""One process of the generated warm-start campaign (tests/test_warm_campaign.py).

    python tests/_warm_campaign_child.py SRC_DIR FLAG CASE [CASE ...]

Each case module (tests/_warm_campaign.py writes them) defines ``build()``,
``teardown()``, ``TRAIN`` and ``AMBIENT``, and ``step`` where the backward runs
in the compiled function.  Every case is compiled with inductor and called on
a fixed input under its ambient setting, then run eagerly in this process; its
outputs and gradients are compared.  Prints one JSON line: per case, whether
compiled equalled eager, the frames Dynamo traced for it (compiled autograd's
own graphs included), and a digest of the eager results (to tell whether a
change shows).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import sys

import torch

import stableguards
from _traced import TRACED


def _hooks(scale: float, inlined: bool) -> contextlib.AbstractContextManager:
    """Saved-tensor hooks, plain functions or FX graphs (which AOTAutograd inlines into the
    compiled graphs).  They scale by a power of two and back, exactly: a compiled graph
    saves other tensors than eager does, so hooks that changed values would make the two
    differ by design; changed hooks are other code with the same results."""
    def pack(t):
        return torch.mul(t, scale)

    def unpack(t):
        return torch.mul(t, 1.0 / scale)

    if inlined:
        pack, unpack = torch.fx.symbolic_trace(pack), torch.fx.symbolic_trace(unpack)
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def ambient(name: str) -> contextlib.AbstractContextManager:
    stack = contextlib.ExitStack()
    if name == "no_grad":
        stack.enter_context(torch.no_grad())
    elif name == "inference_mode":
        stack.enter_context(torch.inference_mode())
    elif name == "autocast":
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
    elif name == "float64":
        prior = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        stack.callback(torch.set_default_dtype, prior)
    elif name.endswith("saved_tensor_hooks") or name.endswith("saved_tensor_hooks_changed"):
        if name.startswith("inlined"):  # on every saved tensor, as eager applies them (not only donated ones)
            stack.enter_context(torch._functorch.config.patch(saved_tensors_hooks_filtering_mode="all"))
        stack.enter_context(_hooks(4.0 if name.endswith("changed") else 2.0, name.startswith("inlined")))
    elif name.startswith("dynamo_setting"):
        stack.enter_context(torch._dynamo.config.patch(specialize_float=name.endswith("changed")))
    elif name.startswith("inductor_setting"):
        stack.enter_context(torch._inductor.config.patch(epilogue_fusion=not name.endswith("changed")))
    elif name == "compiled_autograd":
        stack.enter_context(torch._dynamo.config.patch(compiled_autograd=True))
    return stack


def call(fn, module, train: bool, step: bool) -> list[torch.Tensor]:
    """``fn`` on the case's input: its output, and with ``train`` the gradients of the input
    and the parameters, from a backward ``fn`` runs itself when it is a ``step``."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3), dtype=torch.get_default_dtype())
    x.requires_grad_(train)
    params = list(module.parameters()) if isinstance(module, torch.nn.Module) else []
    for p in params:
        p.grad = None
    out = fn(x)
    # Whether the output requires grad is a result too: a training case whose change is
    # no_grad has no backward to run, and a stale graph would still record one.
    results = [out.detach().float(), torch.tensor(float(out.requires_grad))]
    if train and out.requires_grad and not step:
        out.float().sum().backward()
    if train:
        results += [t.grad.detach().float() for t in [x, *params] if t.grad is not None]
    return results


def run_case(name: str) -> dict:
    """A setting named ``<setting>_call`` is entered for the calls only: ``torch.compile`` is
    called outside it, as a job compiles at set-up and calls in a loop under autocast."""
    module = importlib.import_module(name)
    frames = len(TRACED)
    step = hasattr(module, "step")
    setting = module.AMBIENT.removesuffix("_call")
    try:
        with ambient(setting):
            model = module.build()
            fn = model
            if step:  # the program and its backward, in one compiled function
                module.MODEL, fn = model, module.step
        compiling = contextlib.nullcontext() if setting != module.AMBIENT else ambient(setting)
        with compiling:
            compiled = torch.compile(fn)
        with ambient(setting):
            got = call(compiled, model, module.TRAIN, step)
            traced = len(TRACED) - frames
            want = call(fn, model, module.TRAIN, step)
    finally:
        module.teardown()
    matches = len(got) == len(want) and all(torch.allclose(g, w, **_tolerance(setting, w))
                                            for g, w in zip(got, want))
    digest = hashlib.sha256(b"".join(w.round(decimals=3).numpy().tobytes() for w in want)).hexdigest()[:16]
    return {"matches": matches, "frames": traced, "eager": digest}


def _tolerance(ambient: str, want: torch.Tensor) -> dict:
    """bfloat16 under autocast: compiled and eager round differently, by a share of the largest
    magnitude (a gradient summed over large activations), not only of each element.  A stale
    graph differs by a changed factor (1.5 against 2), far beyond it."""
    if ambient != "autocast":
        return {"rtol": 1e-4, "atol": 1e-5}
    return {"rtol": 5e-2, "atol": 5e-2 * max(1.0, float(want.abs().max()) if want.numel() else 1.0)}


def main(src: str, flag: bool, names: list[str]) -> dict:
    sys.path.insert(0, src)
    torch._dynamo.config.stable_guards = flag
    results = {name: run_case(name) for name in names}
    return {"cases": results, "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2] == "1", sys.argv[3:])))
