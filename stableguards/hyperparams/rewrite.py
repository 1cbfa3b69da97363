"""Scheduled hyperparameters under inductor: keep a float ``lr`` a graph input.

Dynamo passes a float that changed between calls (``param_groups[0]['lr']``)
into the graph as a 0-d tensor and reads it back as a SymFloat.  Before
inductor, AOTAutograd's ``tensorify_python_scalars`` turns SymFloat arithmetic
back into tensor arithmetic, but only where the SymFloat is a positional
argument of a few binary ops (``mul.Tensor``, ``add.Tensor``, ``pow.Tensor_Tensor``,
…).  Optimizers pass hyperparameters elsewhere: ``add(grad, alpha=-lr)``,
``pow.Scalar(beta1, step)``, ``fma(grad², 1-beta2, v)``, ``addcdiv(…,
value=-lr)``.  Those SymFloats are specialized, the frame restarts with the
value as a constant, and every learning-rate change recompiles until the
recompile limit, after which the step runs eagerly.

``rewrite`` moves each such use into a form the pass handles: the scalar
becomes a positional factor of ``mul.Tensor``.  Each rewrite is an identity of
real arithmetic (``a + alpha*b``, ``s**t``, ``a*s + c``), so the graph computes
what it computed; the float rounding can differ by what an extra rounding step
costs (eager's CPU kernels fuse ``a + alpha*b``; here it is a multiply, then an
add, which inductor may fuse again): about one ulp of the result per op.

No guard is dropped: torch would specialize the float and guard its value;
rewritten, the graph takes the value as an input and is right for every value,
so that guard has nothing left to prove.  Guards that AOTAutograd or inductor
add on the float while tracing stay (the hook makes sure AOTAutograd's cache
does not lose them).

Plain ``torch.fx`` and ``aten`` only; the hook (``hooks.optimizers``) decides
when to run it and on which symbols.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch imports stableguards while it loads (entry point): no import here
    import torch.fx


def hyperparameter_source(name: str) -> bool:
    """Whether a symbol's source is an optimizer hyperparameter: a value in a param
    group (``…param_groups[0]['lr']``, ``…['betas'][0]``)."""
    return ".param_groups[" in name or "['param_groups'][" in name


def rewrite(graph: torch.fx.Graph, is_scheduled: Callable[[Any], bool], fake_mode: Any) -> int:
    """Rewrite the uses of scheduled SymFloats that tensorify cannot lift; return how many.

    ``is_scheduled(symfloat)`` says whether a SymFloat may be rewritten (all its
    symbols are hyperparameters).  ``fake_mode`` computes the new nodes' values.
    A node this does not know is left as it is: tensorify then specializes its
    scalar, as without this pass.
    """
    def scheduled(value: Any) -> bool:
        return _is_symfloat(value) and is_scheduled(value)

    done = 0
    for node in list(graph.nodes):
        plan = _plans().get(node.target) if node.op == "call_function" else None
        if plan is not None and plan(graph, node, scheduled, fake_mode):
            done += 1
    return done


def _is_symfloat(value: Any) -> bool:
    import torch

    return isinstance(value, torch.SymFloat)


def _val(arg: Any) -> Any:
    import torch.fx

    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _node(graph: Any, before: Any, target: Any, args: tuple, fake_mode: Any,
          kwargs: dict[str, Any] | None = None) -> Any:
    """A new call of ``target`` before ``before``, with its value computed on fake tensors."""
    kwargs = kwargs or {}
    with fake_mode:
        value = target(*(_val(a) for a in args), **{k: _val(v) for k, v in kwargs.items()})
    with graph.inserting_before(before):
        new = graph.call_function(target, args, kwargs)
    new.meta["val"] = value
    return new


def _scaled(graph: Any, node: Any, tensor: Any, scalar: Any, fake_mode: Any) -> Any:
    """``tensor * scalar`` with the scalar positional: the form tensorify lifts."""
    import torch

    return _node(graph, node, torch.ops.aten.mul.Tensor, (tensor, scalar), fake_mode)


def _alpha(graph: Any, node: Any, scheduled: Callable[[Any], bool], fake_mode: Any) -> bool:
    """``add/sub.Tensor(a, b, alpha=s)`` -> ``add/sub.Tensor(a, b * s)``."""
    alpha = node.kwargs.get("alpha")
    if len(node.args) != 2 or not scheduled(_val(alpha)):
        return False
    scaled = _scaled(graph, node, node.args[1], alpha, fake_mode)
    node.args = (node.args[0], scaled)
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}
    return True


def _fma(graph: Any, node: Any, scheduled: Callable[[Any], bool], fake_mode: Any) -> bool:
    """``prims.fma(a, s, c)`` (= a*s + c) -> ``add.Tensor(a * s, c)``."""
    import torch

    a, s, c = node.args
    if not scheduled(_val(s)):
        return False
    scaled = _scaled(graph, node, a, s, fake_mode)
    _retarget(node, torch.ops.aten.add.Tensor, (scaled, c))
    return True


def _pointwise_value(op_name: str) -> Callable[..., bool]:
    """``addcmul/addcdiv(x, t1, t2, value=s)`` -> ``add.Tensor(x, mul/div(t1, t2) * s)``."""

    def plan(graph: Any, node: Any, scheduled: Callable[[Any], bool], fake_mode: Any) -> bool:
        import torch

        value = node.kwargs.get("value")
        if len(node.args) != 3 or set(node.kwargs) != {"value"} or not scheduled(_val(value)):
            return False
        x, t1, t2 = node.args
        inner = _node(graph, node, getattr(torch.ops.aten, op_name).Tensor, (t1, t2), fake_mode)
        _retarget(node, torch.ops.aten.add.Tensor, (x, _scaled(graph, node, inner, value, fake_mode)))
        return True

    return plan


def _lerp(graph: Any, node: Any, scheduled: Callable[[Any], bool], fake_mode: Any) -> bool:
    """``lerp.Scalar(a, b, s)`` -> ``add.Tensor(a, (b - a) * s)``."""
    import torch

    a, b, s = node.args
    if node.kwargs or not scheduled(_val(s)):
        return False
    diff = _node(graph, node, torch.ops.aten.sub.Tensor, (b, a), fake_mode)
    _retarget(node, torch.ops.aten.add.Tensor, (a, _scaled(graph, node, diff, s, fake_mode)))
    return True


def _pow_scalar(graph: Any, node: Any, scheduled: Callable[[Any], bool], fake_mode: Any) -> bool:
    """``pow.Scalar(s, t)`` -> ``pow.Tensor_Tensor(one * s, t)``, ``one`` a 0-d tensor of the
    result's dtype: eager casts the scalar base to that dtype too."""
    import torch

    s, t = node.args
    if node.kwargs or not scheduled(_val(s)):
        return False
    dtype, device = node.meta["val"].dtype, _val(t).device
    one = _node(graph, node, torch.ops.aten.scalar_tensor.default, (1.0,), fake_mode,
                {"dtype": dtype, "device": device})
    _retarget(node, torch.ops.aten.pow.Tensor_Tensor, (_scaled(graph, node, one, s, fake_mode), t))
    return True


def _full(graph: Any, node: Any, scheduled: Callable[[Any], bool], fake_mode: Any) -> bool:
    """``full(size, s)`` -> ``full(size, 1.0) * s`` (exact: ``1.0 * s`` rounds as ``s`` does)."""
    import torch

    size, s = node.args
    if not scheduled(_val(s)):
        return False
    ones = _node(graph, node, torch.ops.aten.full.default, (size, 1.0), fake_mode, dict(node.kwargs))
    _retarget(node, torch.ops.aten.mul.Tensor, (ones, s))
    return True


def _retarget(node: Any, target: Any, args: tuple) -> None:
    """Same value, another op: users and ``meta['val']`` stay."""
    node.target, node.args, node.kwargs = target, args, {}


def lerp_without_pinning(original: Callable[..., Any], is_scheduled: Callable[[Any], bool]) -> Callable[..., Any]:
    """``_foreach_lerp.Scalar``'s decomposition, for a scheduled SymFloat weight.

    inductor's own reads the weight with ``torch.tensor(w).item()``, which pins
    it to one value; this one computes ``start + (end - start) * w`` with
    foreach ops whose scalar ``rewrite`` lifts.  Eager uses the same formula
    for ``|w| < 0.5`` and ``end - (end - start) * (1 - w)`` above it: the same
    value up to rounding.  Only for float32/float64 tensors; for half types
    eager computes in float32, and the original decomposition is kept.
    """
    import torch

    def decompose(starts: list, ends: list, weight: Any) -> Any:
        if not (_is_symfloat(weight) and is_scheduled(weight)
                and all(t.dtype in (torch.float32, torch.float64) for t in (*starts, *ends))):
            return original(starts, ends, weight)
        return torch._foreach_add(starts, torch._foreach_mul(torch._foreach_sub(ends, starts), weight))

    return decompose


def _foreach(element: Any, scalar: int | str, scalar_kwarg: str | None = None) -> Callable[..., bool]:
    """A foreach op with a scheduled scalar, unfolded into one ``element`` op per tensor.

    ``scalar`` is where the foreach op takes its scalar (an argument index or a
    kwarg name); ``scalar_kwarg`` names the kwarg the element op takes it as
    (``addcmul``'s ``value``), else it stays where it was.  Each element op then
    gets its own rewrite, and ``getitem(foreach, i)`` users read element ``i``.
    """

    def plan(graph: Any, node: Any, scheduled: Callable[[Any], bool], fake_mode: Any) -> bool:
        import operator

        if isinstance(scalar, int):
            value = node.args[scalar] if scalar < len(node.args) else None
        else:
            value = node.kwargs.get(scalar)
        if not scheduled(_val(value)):
            return False
        if not all(u.target is operator.getitem and isinstance(u.args[1], int) for u in node.users):
            return False
        lists = [a for a in node.args if isinstance(a, (list, tuple))]
        elements = []
        for i in range(len(lists[0])):
            args = tuple(a[i] if isinstance(a, (list, tuple)) else a for a in node.args)
            kwargs = dict(node.kwargs)
            if scalar_kwarg is not None:
                args = args[:scalar] + args[scalar + 1:]
                kwargs[scalar_kwarg] = value
            one = _node(graph, node, element, args, fake_mode, kwargs)
            rewrite_one = _plans().get(element)
            if rewrite_one is not None:
                rewrite_one(graph, one, scheduled, fake_mode)
            elements.append(one)
        for user in list(node.users):
            user.replace_all_uses_with(elements[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        return True

    return plan


@functools.cache
def _plans() -> dict[Any, Callable[..., bool]]:
    """op -> its rewrite (built on first use: torch imports stableguards while it loads)."""
    import torch
    import torch._prims  # registers the prims ops

    aten = torch.ops.aten
    # prims.fma (torch 2.15) is what inductor's addcmul decomposition emits.
    fma = getattr(torch.ops.prims, "fma", None)
    return {
        **({fma.default: _fma} if fma is not None else {}),
        aten.add.Tensor: _alpha,
        aten.sub.Tensor: _alpha,
        aten.addcmul.default: _pointwise_value("mul"),
        aten.addcdiv.default: _pointwise_value("div"),
        aten.lerp.Scalar: _lerp,
        aten.pow.Scalar: _pow_scalar,
        aten.full.default: _full,
        aten._foreach_add.List: _foreach(aten.add.Tensor, "alpha"),
        aten._foreach_sub.List: _foreach(aten.sub.Tensor, "alpha"),
        aten._foreach_add.Scalar: _foreach(aten.add.Tensor, 1),
        aten._foreach_sub.Scalar: _foreach(aten.sub.Tensor, 1),
        aten._foreach_mul.Scalar: _foreach(aten.mul.Tensor, 1),
        aten._foreach_div.Scalar: _foreach(aten.div.Tensor, 1),
        aten._foreach_pow.ScalarAndTensor: _foreach(aten.pow.Scalar, 0),
        aten._foreach_addcmul.Scalar: _foreach(aten.addcmul.default, 3, "value"),
        aten._foreach_addcdiv.Scalar: _foreach(aten.addcdiv.default, 3, "value"),
        aten._foreach_lerp.Scalar: _foreach(aten.lerp.Scalar, 2),
    }
