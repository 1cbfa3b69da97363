"""What Dynamo leaves unguarded inside one process, and a restart must check.

Dynamo skips some checks because the facts behind them rarely change while a
process runs: the hooks on a submodule (``skip_nnmodule_hook_guards``) and the
global module hooks, a module global that would shadow a builtin the code
reads, what an ``assume_constant_result`` function returned.  Between two
processes they change routinely (a command-line switch adds a hook), and a
restarted process used to trace them in afresh.  A saved entry records each
as a ``guard_rules.Fact`` when it is saved, and the warm process writes the
same fact from what it holds before the entry serves a call: a fact that
differs, or that cannot be written, keeps the entry from serving.

Kinds (a fact's ``kind``):

* ``MODULE_HOOKS``: the forward/backward (pre-)hooks of a module the compile
  traced, by identity, with their flags; keyed by the module's source;
* ``GLOBAL_MODULE_HOOKS``: the same for ``torch.nn.modules.module``'s global
  hooks;
* ``UNSHADOWED_BUILTINS``: the builtins a traced function reads that its
  module's globals do not define;
* ``CONSTANT_RESULT``: an ``assume_constant_result`` function's result for
  the arguments the compile called it with, and likewise a call Dynamo folds
  without a guard whose result is the process's place in its job (rank,
  world size, process group, device present);
* ``ENVIRONMENT``: an environment variable the traced code read (through
  ``os.environ`` or ``os.getenv``), its value or its absence: Dynamo guards a
  value it read, but not that a variable it found missing is still missing;
* ``UNTRACED_READS``: a function a graph runs without Dynamo tracing it (a
  checkpointing ``context_fn`` and the policy it reaches, an ``fx.wrap``'d
  function), at the source of the identity guard on it: what it runs and
  reads, recursively (``identity.reads``).  Dynamo's identity guard
  covers its code, defaults and closure, not the globals it reads;
* ``GRAPH_TENSORS``: the tensors a graph takes in front of its inputs (an
  optimizer's parameters and state, which Dynamo makes graph attributes), at
  their sources: what the compiled code sees of each, and which of them are
  one tensor or views of one storage.  The graph was compiled for those
  relations (an in-place update through one is seen through the other), and
  each tensor is bound on its own in another process
  (``warm_start.hooks.graph_params``).

* ``OPERATOR_KERNELS``: a custom operator the traced code calls, by what its
  kernels compute (``stableguards.operators``): the graph holds its
  decomposition, and what its fake kernel and backward said, while Dynamo
  guards nothing about it and names it by its name alone.
* ``HASH_SEED``: the process's str and bytes hash seed, where the trace folded
  a value that depends on it (``hash()`` of a string, the order a set or
  frozenset of strings iterates in, a set's repr): Python draws a new seed in
  every process unless ``PYTHONHASHSEED`` fixes it, and Dynamo guards none of
  these.  A value that depends on an address instead (``hash()`` of an object
  or, before Python 3.12, of None; a default repr; an id) or on a random
  generator's state has no fact: the entry is left out (``per_process``).

Plain Python: hooks are read by attribute name, objects described by
``identity.objects``.
"""

from __future__ import annotations

import builtins
import dis
import functools
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stableguards.components import digest_text, stable_repr
from stableguards.warm_start.guard_rules import Fact, Unprovable

MODULE_HOOKS = "MODULE_HOOKS"
GLOBAL_MODULE_HOOKS = "GLOBAL_MODULE_HOOKS"
UNSHADOWED_BUILTINS = "UNSHADOWED_BUILTINS"
CONSTANT_RESULT = "CONSTANT_RESULT"
ENVIRONMENT = "ENVIRONMENT"
UNTRACED_READS = "UNTRACED_READS"
GRAPH_TENSORS = "GRAPH_TENSORS"
OPERATOR_KERNELS = "OPERATOR_KERNELS"
HASH_SEED = "HASH_SEED"
KINDS = (MODULE_HOOKS, GLOBAL_MODULE_HOOKS, UNSHADOWED_BUILTINS, CONSTANT_RESULT, ENVIRONMENT, UNTRACED_READS,
         GRAPH_TENSORS, OPERATOR_KERNELS, HASH_SEED)

# (hooks dict, the dicts of per-hook flags keyed like it): an nn.Module's, then the globals'.
_MODULE_HOOKS = (("_forward_pre_hooks", ("_forward_pre_hooks_with_kwargs",)),
                 ("_forward_hooks", ("_forward_hooks_with_kwargs", "_forward_hooks_always_called")),
                 ("_backward_pre_hooks", ()), ("_backward_hooks", ()))
_GLOBAL_HOOKS = (("_global_forward_pre_hooks", ()),
                 ("_global_forward_hooks",
                  ("_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called")),
                 ("_global_backward_pre_hooks", ()), ("_global_backward_hooks", ()))
_SIMPLE_TYPES = (type(None), bool, int, float, complex, str, bytes)


def module_hooks(module: Any, source: str, identity: Callable[[Any], str | None]) -> Fact:
    """The hooks an ``nn.Module`` runs around its forward, as a fact about ``source``."""
    claim = _hooks(lambda name: getattr(module, name, None), _MODULE_HOOKS, identity, source)
    return Fact(source, MODULE_HOOKS, f"{claim}; full backward={getattr(module, '_is_full_backward_hook', None)}")


def global_module_hooks(module_module: Any, identity: Callable[[Any], str | None]) -> Fact:
    """The global module hooks (``torch.nn.modules.module``), which every module runs."""
    source = getattr(module_module, "__name__", "?")
    claim = _hooks(lambda name: getattr(module_module, name, None), _GLOBAL_HOOKS, identity, source)
    return Fact(source, GLOBAL_MODULE_HOOKS,
                f"{claim}; full backward={getattr(module_module, '_global_is_full_backward_hook', None)}")


def _hooks(read: Callable[[str], Any], layout: tuple, identity: Callable[[Any], str | None], where: str) -> str:
    """Each hooks dict in order: its hooks by identity and their flags.  The dicts' keys are
    handle ids from a process-wide counter, so they are left out; the order is kept."""
    written = []
    for name, flag_names in layout:
        hooks = read(name) or {}
        flags = [read(f) or {} for f in flag_names]
        entries = []
        for key, hook in hooks.items():
            described = identity(hook)
            if described is None:
                raise Unprovable(f"{where}.{name} holds {hook!r:.80}, which has no identity that holds in "
                                 f"another process")
            entries.append(described + "".join(f"+{f}" for f, d in zip(flag_names, flags) if d.get(key)))
        written.append(f"{name.lstrip('_')}=[{', '.join(entries)}]")
    return "; ".join(written)


@functools.lru_cache(maxsize=4096)  # a model inlines the same few functions once per layer
def read_globals(code: types.CodeType) -> frozenset[str]:
    """The names ``code`` (nested code included) loads as globals."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= read_globals(const)
    return frozenset(names)


def unshadowed_builtins(module: str, globals_: Mapping[str, Any], names: Iterable[str]) -> Fact:
    """Which of ``names`` (builtins a traced function of ``module`` reads) its globals
    define: none, when the fact was recorded."""
    names = sorted(set(names))
    shadowed = [n for n in names if n in globals_]
    claim = f"builtins read: {', '.join(names)}" + (f"; shadowed by globals: {', '.join(shadowed)}" if shadowed else "")
    return Fact(module, UNSHADOWED_BUILTINS, claim)


def builtins_read(code: types.CodeType, globals_: Mapping[str, Any]) -> set[str]:
    """The builtins ``code`` reads: globals it loads that its module does not define."""
    return {n for n in read_globals(code) if n not in globals_ and hasattr(builtins, n)}


def constant_result(fn: Any, args: tuple, kwargs: Mapping[str, Any], result: Any,
                    identity: Callable[[Any], str | None]) -> Fact:
    """What an ``assume_constant_result`` function (or a call Dynamo folded) returned for
    constant arguments."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    described = identity(fn)
    if described is None:
        raise Unprovable(f"the call to {name} the compile folded has no identity that holds in another process")
    if not all(_simple(a) for a in (*args, *kwargs.values(), result)):
        raise Unprovable(f"the compile folded a call to {name} with arguments or a result that cannot be "
                         f"compared across processes ({args!r:.60}, {kwargs!r:.40} -> {result!r:.60})")
    call = f"({', '.join(map(stable_repr, args))}{', ' if args and kwargs else ''}" \
           f"{', '.join(f'{k}={stable_repr(v)}' for k, v in sorted(kwargs.items()))})"
    return Fact(name + call, CONSTANT_RESULT, f"{described}{call} == {stable_repr(result)}")


def _simple(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_simple(v) for v in value)
    if isinstance(value, dict):
        return all(_simple(k) and _simple(v) for k, v in value.items())
    return type(value) in _SIMPLE_TYPES


def environment(key: str, environ: Mapping[str, str]) -> Fact:
    """An environment variable's value, or its absence."""
    value = environ.get(key)
    return Fact(f"os.environ[{key!r}]", ENVIRONMENT, "absent" if value is None else f"== {value!r}")


def untraced_reads(fn: Any, source: str, describe: Callable[[Any], str | None]) -> Fact:
    """What a function found at ``source`` runs and reads (``describe``: a rule that includes
    the globals it reads), for a graph that runs it without Dynamo tracing it."""
    described = describe(fn)
    if described is None:
        raise Unprovable(f"{source} holds {fn!r:.80}, which reads something with no identity that holds in "
                         f"another process")
    return Fact(source, UNTRACED_READS, f"reads {digest_text(described)}")


def graph_tensors(graph: str, tensors: Iterable[tuple[str, Any]], describe: Callable[[Any], str | None],
                  storage: Callable[[Any], Any]) -> Fact:
    """The tensors ``graph`` takes in front of its inputs, (source, tensor) in its order: each
    described (``describe``: what its compiled code sees), and where one is the same tensor
    as an earlier one, or shares its storage (``storage``: a key per storage)."""
    parts, objects, storages = [], {}, {}
    for source, tensor in tensors:
        described = describe(tensor)
        if described is None:
            raise Unprovable(f"{graph} takes {source}, which is not a tensor")
        same, shared = objects.setdefault(id(tensor), source), storages.setdefault(storage(tensor), source)
        parts.append(f"{source}: {described}" + (f", is {same}" if same != source else "")
                     + (f", shares the storage of {shared}" if shared != source else ""))
    return Fact(graph, GRAPH_TENSORS, "; ".join(parts))


def operator_kernels(name: str, description: str) -> Fact:
    """What custom operator ``name`` computes (its description: ``stableguards.operators``)."""
    return Fact(name, OPERATOR_KERNELS, f"kernels {digest_text(description)[:32]}")


# Hashed in each process to tell its seed: equal hashes of both mean one SipHash key (up to a
# collision of two 64-bit hashes), and so equal hashes of every str and bytes.
_SEED_PROBES = ("stableguards: the hash seed", b"stableguards: the hash seed")
SEED = "seed"  # a value that depends on the str/bytes hash seed: a fact
ADDRESS = "address"  # a value that depends on where objects are, or on a generator's state: no fact


def hash_seed() -> Fact:
    """The process's str and bytes hash seed, as hashes of two fixed probes."""
    return Fact("str and bytes hashes", HASH_SEED, f"hash(probes) == {[hash(p) for p in _SEED_PROBES]}")


def per_process(value: Any) -> str | None:
    """What ``hash(value)``, or the order ``value`` (a set) iterates in, depends on besides the
    program: None (nothing: numbers, and tuples and frozensets of them), ``SEED`` (str,
    bytes, enum members: their names' hashes) or ``ADDRESS`` (anything else: an object's
    default hash is its address, and so is None's before Python 3.12).  Deny by default."""
    import enum
    import sys

    kind = type(value)
    if kind in (bool, int, float, complex) or isinstance(value, int) and kind.__hash__ is int.__hash__:
        return None  # an IntEnum member hashes as its int
    if kind in (str, bytes) or isinstance(value, enum.Enum) and kind.__hash__ is enum.Enum.__hash__:
        return SEED
    if value is None and sys.version_info >= (3, 12):
        return None  # a constant hash from 3.12 on
    if kind in (tuple, frozenset, set):
        found = {per_process(item) for item in value}
        return ADDRESS if ADDRESS in found else SEED if SEED in found else None
    return ADDRESS
