"""Scheduled hyperparameters: the graph rewrite (plain FX, no compile), then inductor steps.

Each rewrite must compute what the op computed, for any value of the scalar:
every case runs the rewritten graph on random tensors and scalars drawn from a
seeded source and compares it with the original op.
"""

from __future__ import annotations

import operator
import random

import pytest
import torch
import torch._prims  # noqa: F401 - registers the prims ops
import torch.fx
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from stableguards.hyperparams.rewrite import hyperparameter_source, rewrite

aten = torch.ops.aten
FMA = getattr(torch.ops.prims, "fma", None)  # torch 2.15
N = 3  # tensors per foreach list
# Ops whose positional SymFloat arguments torch's tensorify_python_scalars lifts.
LIFTED = {aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor}


def _cases():
    """name -> (op, how its arguments are laid out: 't' a tensor, 'L' a list of tensors,
    's' the scheduled scalar, other values as they are; kwargs likewise)."""
    return {
        "add_alpha": (aten.add.Tensor, ("t", "t"), {"alpha": "s"}),
        "sub_alpha": (aten.sub.Tensor, ("t", "t"), {"alpha": "s"}),
        **({"fma": (FMA.default, ("t", "s", "t"), {})} if FMA is not None else {}),
        "addcmul_value": (aten.addcmul.default, ("t", "t", "t"), {"value": "s"}),
        "addcdiv_value": (aten.addcdiv.default, ("t", "t", "p"), {"value": "s"}),
        "lerp": (aten.lerp.Scalar, ("t", "t", "s"), {}),
        "pow_scalar": (aten.pow.Scalar, ("s", "t"), {}),
        "full": (aten.full.default, ([4], "s"), {"dtype": torch.float32}),
        "foreach_add_alpha": (aten._foreach_add.List, ("L", "L"), {"alpha": "s"}),
        "foreach_sub_alpha": (aten._foreach_sub.List, ("L", "L"), {"alpha": "s"}),
        "foreach_add_scalar": (aten._foreach_add.Scalar, ("L", "s"), {}),
        "foreach_mul_scalar": (aten._foreach_mul.Scalar, ("L", "s"), {}),
        "foreach_div_scalar": (aten._foreach_div.Scalar, ("L", "s"), {}),
        "foreach_pow": (aten._foreach_pow.ScalarAndTensor, ("s", "L"), {}),
        "foreach_addcmul": (aten._foreach_addcmul.Scalar, ("L", "L", "L", "s"), {}),
        "foreach_addcdiv": (aten._foreach_addcdiv.Scalar, ("L", "L", "P", "s"), {}),
        "foreach_lerp": (aten._foreach_lerp.Scalar, ("L", "L", "s"), {}),
    }


def _build(op, layout, kw_layout, scalar):
    """A graph calling ``op`` once, with the scalar a SymFloat placeholder, and its inputs."""
    shape_env = ShapeEnv()
    fake_mode = FakeTensorMode(shape_env=shape_env)
    symbol = shape_env.create_unspecified_symbol(scalar, ConstantSource("lr"), dynamic_dim=DimDynamic.DYNAMIC)
    sym_scalar = shape_env.create_symfloatnode(symbol, hint=scalar, source=ConstantSource("lr"))
    graph, inputs, vals = torch.fx.Graph(), [], {}

    def placeholder(value, fake):
        node = graph.placeholder(f"in{len(inputs)}")
        node.meta["val"] = fake
        inputs.append(value)
        return node

    def arg(kind):
        if kind == "s":
            return placeholder(scalar, sym_scalar)
        if kind in ("t", "p"):
            value = torch.randn(4) if kind == "t" else torch.rand(4) + 0.5  # "p": a safe divisor
            return placeholder(value, fake_mode.from_tensor(value))
        if kind in ("L", "P"):
            return [arg("t" if kind == "L" else "p") for _ in range(N)]
        return kind

    args = tuple(arg(k) for k in layout)
    kwargs = {k: arg(v) for k, v in kw_layout.items()}
    with fake_mode:
        val = op(*(_fake(a) for a in args), **{k: _fake(v) for k, v in kwargs.items()})
    out = graph.call_function(op, args, kwargs)
    out.meta["val"] = val
    if isinstance(val, list):
        items = []
        for i in range(len(val)):
            item = graph.call_function(operator.getitem, (out, i))
            item.meta["val"] = val[i]
            items.append(item)
        graph.output(tuple(items))
    else:
        graph.output(out)
    return graph, inputs, fake_mode


def _fake(arg):
    if isinstance(arg, list):
        return [_fake(a) for a in arg]
    return arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg


@pytest.mark.parametrize("name", list(_cases()))
def test_each_rewrite_computes_what_the_op_computed(name):
    op, layout, kw_layout = _cases()[name]
    rng = random.Random(name)
    for _ in range(3):
        torch.manual_seed(rng.randrange(2**31))
        scalar = rng.uniform(-0.99, 0.99) if name != "pow_scalar" and name != "foreach_pow" else rng.uniform(0.5, 0.99)
        graph, inputs, fake_mode = _build(op, layout, kw_layout, scalar)
        before = torch.fx.GraphModule({}, graph)(*inputs)
        count = rewrite(graph, lambda value: True, fake_mode)
        graph.lint()
        assert count == 1
        # The scalar only reaches ops tensorify lifts, as a positional argument.
        scalar_node = next(n for n in graph.nodes if isinstance(n.meta.get("val"), torch.SymFloat))
        for user in scalar_node.users:
            assert user.target in LIFTED and scalar_node in user.args and scalar_node not in user.kwargs.values()
        after = torch.fx.GraphModule({}, graph)(*inputs)
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)


def test_a_scalar_that_is_not_scheduled_is_left_alone():
    op, layout, kw_layout = _cases()["add_alpha"]
    graph, inputs, fake_mode = _build(op, layout, kw_layout, 0.5)
    before = str(graph)
    assert rewrite(graph, lambda value: False, fake_mode) == 0
    assert str(graph) == before


def test_hyperparameter_sources_are_param_group_values():
    assert hyperparameter_source("L['self'].param_groups[0]['lr']")
    assert hyperparameter_source("G['opt'].param_groups[1]['betas'][0]")
    assert not hyperparameter_source("L['scale']")
    assert not hyperparameter_source("L['self'].state[p]['step']")
