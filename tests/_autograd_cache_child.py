"""One process of the AOTAutograd-cache tests: compile graphs torch's cache would bypass, check
each against eager, print the AOTAutograd counters and explain() as JSON.

argv: flag (1/0), variant, cases (each compiled in turn, counters cleared between them).  Warm
start is left to torch (STABLEGUARDS_DISABLE) by the caller, so every process reaches the
AOTAutograd cache."""

from __future__ import annotations

import contextlib
import json
import sys

import torch
import torch._dynamo.utils

import stableguards

flag, VARIANT, CASES = sys.argv[1] == "1", sys.argv[2], sys.argv[3:]
torch._dynamo.config.stable_guards = flag
FACTOR = {"a": 2.0, "b": 3.0}[VARIANT]


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x * FACTOR  # not what autograd would compute: a changed backward shows


def custom_function(x):
    return Scale.apply(x).sin().sum()


def _policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    saved = torch.ops.aten.mm.default if VARIANT == "a" else torch.ops.aten.sin.default
    return CheckpointPolicy.MUST_SAVE if op == saved else CheckpointPolicy.PREFER_RECOMPUTE


def _context_fn():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


class _Opaque:  # an object with no identity across processes, closed over by a policy
    pass


def _opaque_context_fn(opaque=_Opaque()):
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(lambda ctx, op, *a, **k: _policy(ctx, op) if opaque else None)


W = torch.randn(8, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)


def _checkpointed(context_fn):
    from torch.utils.checkpoint import checkpoint

    def fn(x):
        return checkpoint(lambda t: (t @ W).sin() @ W, x, use_reentrant=False, context_fn=context_fn).sum()
    return fn


@torch.fx.wrap
def _scaled(t):
    return t * FACTOR  # a changed FACTOR changes what is saved, not the hook graphs' code


@torch.fx.wrap
def _unscaled(t):
    return t / FACTOR


def _pack_by_method(t):
    return t.to(torch.bfloat16 if VARIANT == "a" else torch.float16)


def _unpack_by_method(t):
    return t.to(torch.float32)


def _pack_wrapped(t):
    return _scaled(t)


def _unpack_wrapped(t):
    return _unscaled(t)


def _hooked(pack, unpack, hashed=False):
    packed, unpacked = torch.fx.symbolic_trace(pack), torch.fx.symbolic_trace(unpack)
    if hashed:  # torch's opt-in: the user vouches for the wrapped function's body
        for node in [*packed.graph.nodes, *unpacked.graph.nodes]:
            if node.meta.get("is_wrapped"):
                node.meta["user_cache_hash"] = "v1"

    def fn(x):
        return (x.sin() * x).sum()
    return fn, (packed, unpacked)


def _compiled_autograd_grad(x: torch.Tensor) -> bool:
    """An eager model's backward compiled by compiled autograd: its graph calls the ops compiled
    autograd binds from the C++ engine (one per node type, and ``validate_outputs``).  Whether
    its gradients equal eager's."""
    from torch._dynamo import compiled_autograd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(approximate={"a": "none", "b": "tanh"}[VARIANT]),
                                torch.nn.Linear(16, 4))
    target = torch.tensor([0, 1, 2, 3])
    with compiled_autograd._enable(torch.compile):
        torch.nn.functional.cross_entropy(model(x), target).backward()
    compiled = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), target).backward()
    return bool(all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(compiled, model.parameters(), strict=True)))


def run(case: str) -> dict:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    stableguards.reset()
    if case == "compiled_autograd":
        return _result(_compiled_autograd_grad(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))))
    hooks = None
    if case == "custom_function":
        fn, shape = custom_function, (8,)
    elif case == "checkpoint":
        fn, shape = _checkpointed(_context_fn), (4, 8)
    elif case == "checkpoint_opaque":
        fn, shape = _checkpointed(_opaque_context_fn), (4, 8)
    elif case == "hook_method":
        (fn, hooks), shape = _hooked(_pack_by_method, _unpack_by_method), (8,)
    elif case in ("hook_wrapped", "hook_wrapped_hashed"):
        (fn, hooks), shape = _hooked(_pack_wrapped, _unpack_wrapped, hashed=case.endswith("hashed")), (8,)
    else:
        raise SystemExit(f"unknown case {case}")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), requires_grad=True)
    # Hook graphs given as saved-tensor hooks around the compiled call are inlined into its graph.
    with torch.autograd.graph.saved_tensors_hooks(*hooks) if hooks else contextlib.nullcontext():
        compiled_fn = torch.compile(fn)  # kept: a warm-start entry waits on it for its backward
        compiled_fn(x).backward()
        compiled = x.grad.clone()
        x.grad = None
        fn(x).backward()
    return _result(bool(torch.allclose(compiled, x.grad, rtol=1e-2, atol=1e-2)))


def _result(ok: bool) -> dict:
    counters = torch._dynamo.utils.counters["aot_autograd"]
    return {
        "ok": ok, "hits": counters["autograd_cache_hit"], "misses": counters["autograd_cache_miss"],
        "bypasses": counters["autograd_cache_bypass"], "explain": stableguards.explain(),
    }


print(json.dumps({case: run(case) for case in CASES}))
