"""Graphs torch's AOTAutograd cache bypasses, keyed by what they run: cold then warm in fresh
processes on one cache dir, each compared with eager; a changed body misses and stays correct.

Warm start is left to torch here, so that every restart reaches the AOTAutograd cache.  Each
process compiles every case in turn (one torch import for all of them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _children import child_env, requires_warm_start, run_child

CHILD = Path(__file__).resolve().parent / "_autograd_cache_child.py"
KEYED = ["custom_function", "checkpoint", "hook_method", "hook_wrapped", "compiled_autograd"]
CASES = [*KEYED, "hook_wrapped_hashed", "checkpoint_opaque"]


def _run(cache: Path, flag: bool, variant: str, cases: list[str] = CASES, warm_start: bool = False) -> dict:
    env = child_env(cache, PYTHONHASHSEED="random")
    if not warm_start:
        env["STABLEGUARDS_DISABLE"] = "warm_start"
    return run_child([CHILD, "1" if flag else "0", variant, *cases], env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Flag off: a process, then one whose functions differ (variant b).  Flag on: cold, warm,
    and one whose functions differ."""
    import torch._dynamo  # noqa: F401 - installs the hooks

    from stableguards.hooks import STATE

    if "autograd_cache" not in STATE.installed:
        pytest.skip("this torch has no AOTAutograd cache seams of the shape this part hooks")
    off, on = tmp_path_factory.mktemp("off"), tmp_path_factory.mktemp("on")
    return {"off": _run(off, False, "a"), "off_changed": _run(off, False, "b"),
            "cold": _run(on, True, "a"), "warm": _run(on, True, "a"), "changed": _run(on, True, "b")}


def test_every_process_equals_eager(runs):
    wrong = [(run, case) for run, results in runs.items() for case, result in results.items() if not result["ok"]]
    assert not wrong, wrong


@pytest.mark.parametrize("case", KEYED)
def test_a_graph_torch_bypasses_hits_on_restart_and_a_changed_one_misses(runs, case):
    """Flag off, every restart bypasses the cache; flag on, the restart hits, and a restart
    whose function, policy or hook differs misses (for compiled autograd's graph of an eager
    model: a node whose attribute differs, GELU's ``approximate``)."""
    assert runs["off"][case]["bypasses"] == 1 and runs["off_changed"][case]["bypasses"] == 1
    cold, warm, changed = (runs[run][case] for run in ("cold", "warm", "changed"))
    assert cold["bypasses"] == 0 and cold["misses"] == 1, cold["explain"]
    assert warm["hits"] == 1 and warm["misses"] == 0 and warm["bypasses"] == 0, warm["explain"]
    assert "AOTAutograd cache key holds the identity of" in warm["explain"]
    assert changed["hits"] == 0 and changed["misses"] == 1, changed["explain"]


def test_a_changed_wrapped_body_under_the_users_hash_misses(runs):
    """torch keys an fx.wrap'd hook function by the user's ``user_cache_hash`` alone: flag off, a
    restart whose functions read another factor under the same hash is served the graph compiled
    for the old one (pack and unpack still invert each other here, so only the hit shows it).
    Flag on, the key also holds what the functions run and read."""
    case = "hook_wrapped_hashed"
    assert runs["off_changed"][case]["hits"] == 1  # torch's contract: the user's hash decides
    assert runs["warm"][case]["hits"] == 1
    assert runs["changed"][case]["hits"] == 0 and runs["changed"][case]["misses"] == 1


def test_a_bypass_that_remains_is_named_with_its_fix(runs):
    """A checkpointing policy that closes over an object with no identity stays bypassed, and
    explain() says why and what to do."""
    result = runs["warm"]["checkpoint_opaque"]
    assert result["bypasses"] == 1, result
    assert "AOTAutograd cache bypassed (SAC context_fn does not have a cache_hash" in result["explain"]
    assert "give the context_fn a `cache_hash`" in result["explain"]


@requires_warm_start
def test_warm_start_checks_what_a_checkpointing_policy_reads(tmp_path):
    """A checkpointing policy runs without Dynamo tracing or guarding it: the saved entry
    checks what the context_fn at its source runs and reads (the policy, and the global the
    policy reads), so a restart with the same policy starts warm and one whose policy reads
    another value compiles again instead of being served the old graph.  A policy that closes
    over an object with no identity stays bypassed, and its frame has no entry."""
    cases = ["checkpoint", "checkpoint_opaque"]
    cold = _run(tmp_path, True, "a", cases, warm_start=True)
    warm = _run(tmp_path, True, "a", cases, warm_start=True)
    changed = _run(tmp_path, True, "b", cases, warm_start=True)
    assert "left out" not in cold["checkpoint"]["explain"], cold["checkpoint"]["explain"]
    assert warm["checkpoint"]["ok"] and "installed its saved compiled entry" in warm["checkpoint"]["explain"]
    assert warm["checkpoint"]["misses"] == warm["checkpoint"]["hits"] == 0, warm["checkpoint"]["explain"]
    assert changed["checkpoint"]["ok"] and changed["checkpoint"]["misses"] == 1, changed["checkpoint"]["explain"]
    assert "UNTRACED_READS on L['context_fn']" in changed["checkpoint"]["explain"], changed["checkpoint"]["explain"]
    opaque = warm["checkpoint_opaque"]  # bypassed (compiled again), never served: no graphs to save
    assert opaque["ok"] and opaque["bypasses"] == 1, opaque


def _rebuilt_hooks(dtype):
    """Saved-tensor hooks as graphs, traced again (new objects, the same code) for every step."""
    import torch

    return (torch.fx.symbolic_trace(lambda t: t.to(dtype)), torch.fx.symbolic_trace(lambda t: t.to(torch.float32)))


@pytest.mark.parametrize("flag", [False, True])
def test_hooks_rebuilt_every_step_recompile_only_with_the_flag_off(fresh_dynamo, flag):
    """Dynamo guards inlined saved-tensor hooks by id(): flag off, hooks made again each step
    compile again each step; flag on, the guard compares what they compute, so the same hooks
    rebuilt reuse the graph and other hooks (another dtype) compile again."""
    import torch
    from torch._dynamo.utils import counters

    def step(x):
        return (x.sin() * x).sum()

    compiled = torch.compile(step)
    x = torch.randn(8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    counters.clear()
    with torch._dynamo.config.patch(stable_guards=flag):
        for dtype in (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float16):
            hooks = _rebuilt_hooks(dtype)
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                compiled(x).backward()
                got, x.grad = x.grad, None
                step(x).backward()
                # Compiled code may save other tensors than eager: each is rounded to the hooks' dtype.
                torch.testing.assert_close(got, x.grad, rtol=5e-2, atol=5e-2)
                x.grad = None
    assert counters["stats"]["unique_graphs"] == (2 if flag else 4)


@pytest.mark.parametrize("reason, fix", [
    ("Unsupported call_function target torch._dynamo.compiled_autograd.ops.validate_outputs. ",
     "nothing in your code changes it"),
    ("Unsupported call_function target <function AutogradCompilerInstance.proxy_call_aot_backward.<locals>."
     "call_aot_bwd_prologue at 0x7f00>. ", "nothing in your code changes it"),
    ("Unsupported call_function target <function TensorVariable._method_register_hook.<locals>."
     "_register_hook_trampoline at 0x7f00>. ", "registered before the call"),
    ("Unsupported call_function target <function make.<locals>.f at 0x7f00>. ", "make it a module-level function"),
])
def test_a_bypass_is_named_with_the_fix_for_its_reason(reason, fix):
    import stableguards
    from stableguards.autograd_cache import messages

    stableguards.reset()
    messages.bypassed("f (x.py:1)", reason)
    assert fix in stableguards.explain()
    stableguards.reset()


def test_a_compiled_autograd_op_is_named_only_where_torch_bound_it():
    """Only an op compiled autograd bound under the name of one of torch's node types (or the
    engine's ``validate_outputs``) is identified by its name; a C++ custom function's op (an
    extension's code, numbered per process), a node type torch does not define, and an op
    under a name it was not bound to are not."""
    from torch._dynamo.compiled_autograd import Op, ops

    from stableguards.identity.compiled_autograd import compiled_autograd_identity

    bound = []

    def bind(op):
        if not hasattr(ops, op.__name__):
            setattr(ops, op.__name__, op)
            bound.append(op.__name__)
        return getattr(ops, op.__name__)

    try:
        assert compiled_autograd_identity(Op("MulBackward0", print, False)) is None  # not the bound one
        assert compiled_autograd_identity(bind(Op("MulBackward0", print, False))) == \
            "compiled-autograd-op:MulBackward0"
        assert compiled_autograd_identity(bind(Op("StableguardsExtensionBackward0", print, False))) is None
        assert compiled_autograd_identity(bind(Op("CppNodeStableguards0", print, True))) is None
        assert compiled_autograd_identity(print) is None
    finally:
        for name in bound:
            delattr(ops, name)


def _prologue(metas: list, compile_id: str = "0/0", traces: tuple = ()):
    """A stand-in for compiled autograd's ``call_aot_bwd_prologue`` over a prologue generated
    as AOTAutograd generates one: code run in globals that are no module's."""
    import torch
    from torch._functorch._aot_autograd.runtime_wrappers import AOTDispatchAutograd

    scope = {"torch": torch, "_process_tangent_": AOTDispatchAutograd.process_runtime_tangent,
             "_tangent_metas_": metas, "_compile_id_": compile_id, "_stack_traces_": traces}
    exec("def _backward_prologue(ctx_saved_tensors, ctx_symints, ctx_opaque_objects, flat_args):\n"
         "    return [_process_tangent_(t, m, i, None, _compile_id_, _stack_traces_)[0]\n"
         "            for i, (t, m) in enumerate(zip(flat_args, _tangent_metas_))]\n", scope)
    bw_prologue_fn = scope["_backward_prologue"]

    def call_aot_bwd_prologue(*args):
        return bw_prologue_fn(*args)
    call_aot_bwd_prologue.__module__ = "torch._dynamo.compiled_autograd"
    call_aot_bwd_prologue.__qualname__ = "AutogradCompilerInstance.proxy_call_aot_backward.<locals>." \
                                         "call_aot_bwd_prologue"
    return call_aot_bwd_prologue


def test_a_backward_prologue_is_described_by_its_code_and_the_metadata_it_reads():
    """Compiled autograd's backward prologue is keyed by the code AOTAutograd generated and every
    global it reads: other tangent metadata is another prologue; the compile id and stack
    traces (read for an error message only) are not part of it; a global with no identity
    leaves it with none (the bypass stays)."""
    import torch
    import torch._dynamo.compiled_autograd  # noqa: F401 - what the rule looks for
    from torch._functorch._aot_autograd.schemas import MemoryFormatMeta, PlainTensorMeta

    from stableguards.identity.compiled_autograd import compiled_autograd_identity

    def meta(stride):
        return [PlainTensorMeta(0, MemoryFormatMeta(size=torch.Size([2, 3]), stride=stride))]

    described = compiled_autograd_identity(_prologue(meta((3, 1))))
    assert described is not None and described.startswith("compiled-autograd-prologue:")
    assert compiled_autograd_identity(_prologue(meta((3, 1)), "1/0", ("File x.py",))) == described
    assert compiled_autograd_identity(_prologue(meta((1, 2)))) != described
    class Opaque:  # an instance of a local class: nothing names it in another process
        pass
    assert compiled_autograd_identity(_prologue([Opaque()])) is None
