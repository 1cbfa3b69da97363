"""One process of the edge-graph test (tests/test_flag_never_breaks.py).

    python tests/_edge_child.py FLAG

Compiles each edge callable with inductor and calls it on fixed inputs, beside
eager.  Prints one JSON line: per case, an error if the compiled call raised,
whether it equalled eager, and a digest of the results.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections import OrderedDict

import torch

import stableguards


def _detach_step(x):
    return (x * 2).sum().detach()


class _Scale:
    def __init__(self, k: float) -> None:
        self.k = k

    def apply(self, x):
        return x * self.k

    def __call__(self, x):
        return x + self.k


def _inplace(x):
    x.add_(1)


def _graph_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos()


def _nothing(x):
    return None


def _ordered(x):
    return OrderedDict(a=x.sin(), b=x * 2)  # built again after the graph: collections is loaded


class _Holder:
    @property
    def scale(self):
        torch._dynamo.graph_break()  # the getter's frame is compiled alone: torch cannot name its code
        return 2.0


_HOLDER = _Holder()


def _property_break(x):
    return x * _HOLDER.scale


def _type_checked(x):
    return x * 2 if type(x) is torch.Tensor else x  # Dynamo loads torch to check the type


def _several(x):
    return x, x.view(-1), x[0], x * 1, 3


def _keyword(x, k=2.0):
    return x * k


def _train(model):
    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()
    return step


CASES = {
    "input_returned": lambda x: x,
    "view_only": lambda x: x.view(-1)[1:],
    "times_one": lambda x: x * 1,
    "plus_zero": lambda x: x + 0,
    "detach": lambda x: x.detach(),
    "detached_loss": _detach_step,
    "inplace_only": _inplace,
    "returns_none": _nothing,
    "ordered_dict": _ordered,
    "type_checked": _type_checked,
    "property_graph_break": _property_break,
    "several_outputs": _several,
    "graph_break": _graph_break,
    "partial": functools.partial(_keyword, k=3.0),
    "bound_method": _Scale(2.0).apply,
    "callable_object": _Scale(0.5),
    "lambda": lambda x: (x + 1).relu(),
    "inference_mode": lambda x: x.exp(),
    "train_step": None,  # built per run: a module's parameters take the gradients
    "compiled_autograd": None,
}


def _inputs(name: str) -> torch.Tensor:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    return x.requires_grad_(name in ("detach", "detached_loss"))


def _flat(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach().float()]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [torch.tensor(float(value))] if isinstance(value, (int, float)) else []


def run(name: str) -> dict:
    torch.manual_seed(0)
    if name in ("train_step", "compiled_autograd"):
        model = torch.nn.Linear(8, 2)
        twin = torch.nn.Linear(8, 2)
        twin.load_state_dict(model.state_dict())
        fn, eager_fn = _train(model), _train(twin)
    else:
        fn = eager_fn = CASES[name]
    x, x_eager = _inputs(name), _inputs(name)
    context = torch.inference_mode() if name == "inference_mode" else torch.enable_grad()
    patch = torch._dynamo.config.patch(compiled_autograd=name == "compiled_autograd")
    try:
        with context, patch:
            got = torch.compile(fn)(x)
    except Exception as error:  # noqa: BLE001 - reported, not raised: every case runs
        return {"error": f"{type(error).__name__}: {error}"[:400]}
    with context:
        want = eager_fn(x_eager)
    got_all, want_all = _flat(got) + _flat(x), _flat(want) + _flat(x_eager)
    if name in ("train_step", "compiled_autograd"):
        got_all += [p.grad for p in model.parameters()]
        want_all += [p.grad for p in twin.parameters()]
    matches = len(got_all) == len(want_all) and all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got_all, want_all))
    digest = hashlib.sha256(b"".join(w.round(decimals=4).numpy().tobytes() for w in want_all)).hexdigest()[:16]
    return {"error": None, "matches": matches, "eager": digest}


def record_frames_of_ours() -> set[str]:
    """Record the frames of stableguards' own code that get past Dynamo's skip rules (none
    should): ConvertFrame is called only for frames it did not skip."""
    import os

    import torch._dynamo.convert_frame as convert_frame

    ours, seen = os.path.dirname(stableguards.__file__), set()
    convert = convert_frame.ConvertFrame.__call__

    def recording(self, frame, *args, **kwargs):
        if frame.f_code.co_filename.startswith(ours):
            seen.add(frame.f_code.co_qualname)
        return convert(self, frame, *args, **kwargs)

    convert_frame.ConvertFrame.__call__ = recording
    return seen


if __name__ == "__main__":
    torch._dynamo.config.stable_guards = sys.argv[1] == "1"
    traced_ours = record_frames_of_ours()
    results = {name: run(name) for name in CASES}
    print(json.dumps({"cases": results, "traced_ours": sorted(traced_ours), "explain": stableguards.explain()}))
