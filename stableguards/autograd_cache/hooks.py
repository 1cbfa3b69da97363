"""Where torch decides to bypass its AOTAutograd cache: a key instead, where it is sound.

torch computes a graph's key in ``autograd_cache_key``: ``check_cacheable``
runs ``check_node_safe`` on every node and raises a bypass for a node whose
behaviour the key may not hold; ``AOTAutogradCacheDetails`` collects the key's
parts.  While a key is computed (a context variable, so per compile and per
thread):

* a node torch refuses is accepted when what it runs has an identity, which
  then goes into the key beside everything torch puts there:
  - a call to a Python function of the user's: ``reads_identity`` of the
    function (its code and everything it reads, recursively); torch's own
    private functions and operators keep torch's decision;
  - a custom ``autograd.Function`` (the ``autograd_function_apply`` operator):
    its forward and backward graphs, which Dynamo traced from its
    ``forward``/``setup_context`` and ``backward``.  The operator is pure in
    them and its inputs (the reason torch has the opt-in
    ``autograd_cache_allow_custom_autograd_functions``); the code of both
    graphs goes into the key, and every node in them must pass the same checks;
  - a method called on a value with no example (``t.to(torch.bfloat16)`` in a
    saved-tensor hook graph): the graph's code holds the method's name, and
    every value it can be called on comes from the graph's inputs and from
    calls that passed these checks, so the key holds what it does;
* an ``fx.wrap``'d function in a saved-tensor hook graph and a checkpointing
  ``context_fn`` are hashed by ``reads_identity``, beside the hash the user
  gave (``user_cache_hash``, ``cache_hash``: torch's opt-in contract, which
  alone lets a changed body hit); with neither, the bypass stays;
* a local function in the key (a ``context_fn`` made by a closure), which torch
  cannot pickle, is pickled as its ``reads_identity``;
* a bypass that remains is named in explain() with the user's fix;
* Dynamo's guard on inlined saved-tensor hooks compares what they compute
  instead of their ``id()``.

A graph torch caches anyway gets exactly torch's key.
"""

from __future__ import annotations

import contextvars
import types
from dataclasses import dataclass, field
from typing import Any

from stableguards.autograd_cache import messages
from stableguards.codes import qualified
from stableguards.components import digest_text
from stableguards.hooks.core import Hook
from stableguards.hooks.seams import current, signal
from stableguards.identity.compiled_autograd import compiled_autograd_identity
from stableguards.identity.names import module_of_globals
from stableguards.identity.reads import hook_graph_identity, reads_identity, versioned

_CACHE = "torch._functorch._aot_autograd.autograd_cache"


@dataclass
class _Keying:
    """What one key computation accepted that torch would bypass."""

    identities: list[tuple[str, str]] = field(default_factory=list)  # (label, identity)
    operators: set[int] = field(default_factory=set)  # ids of autograd_function_apply operators accepted
    # Functions identified by what they read, which run without Dynamo tracing them: (label, function).
    unguarded: list[tuple[str, Any]] = field(default_factory=list)


_KEYING: contextvars.ContextVar[_Keying | None] = contextvars.ContextVar("stableguards_keying", default=None)


def _autograd_cache_key(call: Any, *args: Any, **kwargs: Any) -> Any:
    """An AOTAutograd cache key that holds the identities of what a graph torch would bypass
    runs; a bypass that remains is named in explain()."""
    keying = _Keying()
    token = _KEYING.set(keying)
    try:
        result = call(*args, **kwargs)
    except Exception as error:
        messages.bypassed(_frame(), str(error) or type(error).__name__)
        raise
    finally:
        _KEYING.reset(token)
    if keying.identities:
        messages.identified(_frame(), sorted({label for label, _ in keying.identities}))
    if keying.unguarded:
        _tell_untraced(keying.unguarded)
    return result


def _tell_untraced(unguarded: list[tuple[str, Any]]) -> None:
    """A graph that runs functions Dynamo did not trace (a checkpointing policy, an fx.wrap'd
    function) is keyed here by what they read; a warm-start entry of its frame serves on
    Dynamo's guards, which never looked at them, so warm start must check what they read
    itself (slot ``graph.runs_untraced``), or leave the compile out."""
    signal("graph.runs_untraced", unguarded)


def _check_node_safe(call: Any, node: Any) -> None:
    """A node torch would bypass the cache for is accepted when what it runs has an identity,
    which goes into the key."""
    keying = _KEYING.get()
    try:
        return call(node)
    except Exception:
        if keying is None:
            raise
        described = _node_identity(node, keying)
        if described is None:
            raise
        keying.identities.append(described)


def _node_identity(node: Any, keying: _Keying) -> tuple[str, str] | None:
    from torch._functorch.autograd_function import AutogradFunctionApply

    if node.op == "call_method":
        return (f"method {node.target}", f"method:{node.target}") if isinstance(node.target, str) else None
    if node.op != "call_function":
        return None
    if isinstance(node.target, AutogradFunctionApply):
        return _custom_function(node, keying)
    if (described := compiled_autograd_identity(node.target)) is not None:
        return f"compiled autograd's {node.target.__name__}", described
    if not _users(node.target):
        return None  # torch's own (a private function, an operator): torch's decision stands
    described = reads_identity(node.target)
    if described is None:
        return None
    keying.unguarded.append((qualified(node.target), node.target))
    return qualified(node.target), described


def _users(target: Any) -> bool:
    """A Python function of the user's: torch refuses its own private functions and operators
    for reasons an identity does not answer (side tables, kernels referred to by index)."""
    home = module_of_globals(target.__globals__) if isinstance(target, types.FunctionType) else None
    return home is not None and not versioned(home)


def _custom_function(node: Any, keying: _Keying) -> tuple[str, str] | None:
    """A custom autograd.Function's node: the code of its forward and backward graphs, whose
    own nodes must pass (torch's checks, or ours) as the graph's do."""
    from torch._functorch._aot_autograd import autograd_cache

    root = node.graph.owning_module
    graphs = []
    for arg in node.args[:2]:
        graph = getattr(root, arg.target, None) if getattr(arg, "op", None) == "get_attr" else None
        if graph is None or not hasattr(graph, "graph"):
            return None
        for inner in graph.graph.nodes:
            autograd_cache.check_node_safe(inner)  # raises: the bypass stays
        graphs.append(digest_text(graph.code))
    keying.operators.add(id(node.target))
    return "custom autograd.Function", f"autograd_function_apply(forward={graphs[0]}, backward={graphs[1]})"


def _cacheable(call: Any, self: Any) -> bool:
    """A custom autograd.Function's operator is cacheable in a key that holds its graphs."""
    if call(self):
        return True
    keying = _KEYING.get()
    return keying is not None and id(self) in keying.operators


def _context_fn_hash(call: Any, context_fn: Any) -> str | None:
    """A checkpointing ``context_fn`` hashed by what it runs and reads (beside a ``cache_hash``
    the user gave it)."""
    given = call(context_fn)
    return given if _KEYING.get() is None else _hash(given, context_fn, "checkpoint context_fn")


def _hash(given: str | None, fn: Any, label: str) -> str | None:
    """The user's hash (torch's opt-in contract) and, where ``fn`` has one, its identity: a
    changed body never hits under an unchanged hash.  None where neither exists."""
    keying = _KEYING.get()
    if keying is not None:
        keying.unguarded.append((f"{label} {qualified(fn)}", fn))
    described = reads_identity(fn)
    if described is None:
        return given
    ours = "stableguards:" + digest_text(described)
    if given is None and keying is not None:
        keying.identities.append((f"{label} {qualified(fn)}", described))
    return ours if given is None else f"{given}|{ours}"


def _wrapped_hashes(call: Any, gm: Any) -> list[str]:
    """The hashes of the ``fx.wrap``'d functions a saved-tensor hook graph calls: what each
    runs and reads (beside a ``user_cache_hash`` the user set)."""
    if _KEYING.get() is None:
        return call(gm)
    hashes = []
    for node in gm.graph.nodes:
        if node.meta and node.meta.get("is_wrapped", False):
            found = _hash(node.meta.get("user_cache_hash"), node.target, "fx.wrap'd")
            if found is None:
                return call(gm)  # torch's bypass
            hashes.append(found)
    return hashes


def _reduce_by_identity(call: Any, self: Any, obj: Any) -> Any:
    """What torch's pickle cannot name in a key being computed is pickled as its identity.

    * a local function (a checkpointing ``context_fn`` made by a closure, kept in the
      graph's metadata) as what it runs and reads: torch's pickle fails on it ("Can't
      pickle local object") and bypasses the cache;
    * a function compiled autograd puts in its graphs (``compiled_autograd_identity``): an
      op it bound from the C++ engine lives in a namespace object, not a module pickle can
      import, and its backward prologue is a local function.

    A function pickle can name keeps torch's by-name reduction."""
    keying = _KEYING.get()
    if keying is not None and (described := compiled_autograd_identity(obj)) is not None:
        return str, (f"stableguards {digest_text(described)}",)
    if keying is None or not isinstance(obj, types.FunctionType) or "<locals>" not in obj.__qualname__:
        return call(self, obj)
    described = reads_identity(obj)
    if described is None:
        return call(self, obj)  # torch's failure, and its bypass
    if all(known != described for _, known in keying.identities):  # a context_fn is named as one already
        keying.identities.append((f"local function {qualified(obj)}", described))
    return str, (f"stableguards function {digest_text(described)}",)


def _global_by_identity(call: Any, name: str, obj: object) -> str:
    """A function compiled autograd put among a graph's globals is keyed by its identity, which
    torch's import statement cannot give (``compiled_autograd_identity``)."""
    if _KEYING.get() is not None and (described := compiled_autograd_identity(obj)) is not None:
        return f"# stableguards {name}: {digest_text(described)}"
    return call(name, obj)


def _with_identities(call: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """The key's parts, and the identities of what torch would have bypassed (only when there
    are any: other graphs keep torch's key)."""
    call(self, *args, **kwargs)
    keying = _KEYING.get()
    if keying is not None and keying.identities:
        self.stableguards_identities = tuple(sorted(identity for _, identity in keying.identities))


def _saved_tensors_hooks_guard(call: Any, self: Any, guard: Any) -> None:
    """Inlined saved-tensor hooks guarded by what they compute (the code of their graphs and
    the identities of what they call) instead of by ``id()``: the same hooks rebuilt every
    step do not recompile every step.  Hooks with no such identity keep torch's guard."""
    from torch._dynamo.guards import get_verbose_code_parts
    from torch._functorch._aot_autograd import utils

    digest = _hooks_digest(utils.top_saved_tensors_hooks())
    if digest is None:
        return call(self, guard)
    code = [f"stableguards: the inlined saved-tensor hooks compute {digest}"]
    self._set_guard_export_info(guard, code, provided_func_name="AUTOGRAD_SAVED_TENSORS_HOOKS")

    def same_hooks(_: object) -> bool:
        return _hooks_digest(utils.top_saved_tensors_hooks()) == digest

    self.guard_manager.root.add_lambda_guard(same_hooks, get_verbose_code_parts(code, guard), guard.user_stack)


def _hooks_digest(hooks: Any) -> str | None:
    """What inlineable hooks compute, or None (no hooks, hooks that are not graphs, or a graph
    that calls something with no identity)."""
    from torch._functorch._aot_autograd.utils import saved_tensors_hooks_are_inlineable

    if not saved_tensors_hooks_are_inlineable(hooks):
        return None
    parts = [hook_graph_identity(gm.graph.nodes, gm.code) for gm in hooks]
    return None if None in parts else digest_text(";".join(parts))[:32]


def _frame() -> str:
    compile_ = current()
    return compile_.label if compile_ is not None else "a graph"


HOOKS = [
    # AOTAutogradCache.try_load calls these by their module-global names.
    Hook(_CACHE, "autograd_cache_key", "autograd_cache", _autograd_cache_key, lazy=True),
    Hook(_CACHE, "check_node_safe", "autograd_cache", _check_node_safe, lazy=True),
    Hook(_CACHE, "_get_context_fn_cache_hash", "autograd_cache", _context_fn_hash, lazy=True),
    Hook(_CACHE, "_collect_wrapped_user_cache_hashes", "autograd_cache", _wrapped_hashes, lazy=True),
    Hook(_CACHE, "AOTAutogradCacheDetails.__init__", "autograd_cache", _with_identities, lazy=True),
    Hook(_CACHE, "AOTAutogradCachePickler.reducer_override", "autograd_cache", _reduce_by_identity,
         params=("obj",), lazy=True),
    Hook(_CACHE, "AOTAutogradCachePickler._format_global_for_cache_key", "autograd_cache", _global_by_identity,
         lazy=True),
    Hook("torch._ops", "HigherOrderOperator.cacheable", "autograd_cache", _cacheable),
    Hook("torch._dynamo.guards", "GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS", "autograd_cache",
         _saved_tensors_hooks_guard),
]
