"""Custom operators' kernels, read from torch for ``stableguards.operators``.

torch keeps a kernel registered through ``torch.library.Library.impl`` (which
``torch.library.impl``, ``register_kernel``, ``register_autograd``,
``register_fake`` and ``register_vmap`` all reach) in C++ only: nothing in
Python can read it back.  So ``_library_impl``, a recorder that belongs to
no part (``Hook.records``: it changes nothing, and runs whatever the flag from
the end of ``import torch`` on), records each one registered, with where the
dispatcher says it came from.  What torch keeps in Python is read where it
is: a ``custom_op``'s functions (``CustomOpDef``), fake kernels and
torch-dispatch rules (``simple_registry``), ``py_impl`` kernels.

``kernels(op)`` is an operator's description (raising ``Opaque``), made
afresh each time (a ``custom_op``'s functions change without a registration);
``custom_operators(gm)`` the operators a graph calls that are not torch's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

from stableguards.hooks.core import Hook
from stableguards.hooks.state import STATE
from stableguards.operators import Opaque, Recorded, describe, registrations

# Namespaces only torch defines operators in (asked for every node of a graph: no dump read).
_ALWAYS_TORCHS = frozenset({"aten", "prim", "prims"})


def _library_impl(call: Any, self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any,
                  **kwargs: Any) -> None:
    """A Python kernel registered: kept with where the dispatcher says it came from."""
    call(self, op_name, fn, dispatch_key, *args, **kwargs)
    import torch

    name = self._resolve_op_name(op_name, "impl")
    name = name if "::" in name else f"{self.ns}::{name}"
    key = dispatch_key or self.dispatch_key or "CompositeImplicitAutograd"
    where = next((r for r in registrations(torch._C._dispatch_dump(name)) if r.key == key), None)
    if where is not None:
        STATE.kernels.setdefault(name, {})[key] = Recorded(fn, where.file, where.line)


def kernels(op: Any) -> str:
    """What ``op`` (an ``OpOverload`` or ``OpOverloadPacket``) computes: every kernel it has, in
    words the same in every process (``operators.describe``).  Raises Opaque."""
    import torch

    if isinstance(op, torch._ops.OpOverloadPacket):
        return "; ".join(kernels(getattr(op, name)) for name in sorted(op.overloads()))
    return _describe(op, _dispatcher_name(op))


def custom_operators(root: Any) -> list[Any]:
    """The operators a graph (an ``fx.Graph``, or a ``GraphModule`` with the graphs it holds)
    calls that are not torch's own, in order."""
    import torch

    graphs = [root] if isinstance(root, torch.fx.Graph) else \
        [m.graph for m in root.modules() if isinstance(m, torch.fx.GraphModule)]
    found: dict[str, Any] = {}
    for graph in graphs:
        for node in graph.nodes:
            if node.op == "call_function" and is_custom(node.target):
                found.setdefault(str(node.target), node.target)
    return list(found.values())


def is_custom(target: Any) -> bool:
    """Whether ``target`` is an operator whose kernels are not all torch's code: one torch did
    not define, or one given a kernel of the user's (recorded).  Torch registers kernels of its
    own as it imports more of itself (inductor's, the collectives' autograd): those are torch's
    code, which the key holds by torch's version."""
    import torch

    if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return False
    overloads = [getattr(target, n) for n in target.overloads()] \
        if isinstance(target, torch._ops.OpOverloadPacket) else [target]
    return any(not _torch_owned(op, _dispatcher_name(op))
               or any(not _torchs(seen.fn) for seen in _recorded(_dispatcher_name(op)).values()) for op in overloads)


def _describe(op: Any, name: str, open_: frozenset[str] = frozenset()) -> str:
    """``op``'s kernels, and those of every custom operator they name (a kernel that calls
    ``torch.ops.other.op`` runs it: its decomposition is traced through that one too)."""
    import torch

    from stableguards.identity.reads import code_names, reads_identity

    opdef = _custom_op_def(op)
    torch_owned = _torch_owned(op, name)
    recorded, kept = _recorded(name), dict(_kept(op, opdef, torch_owned))
    own = describe(name, registrations(torch._C._dispatch_dump(name)), recorded, kept, torch_dir=_torch_dir(),
                   torch_owned=torch_owned, custom_op=opdef is not None, describe_fn=_kernel_reader(reads_identity))
    names: set[str] = set()
    for fn in _functions([*(r.fn for r in recorded.values()), *kept.values()]):
        names |= code_names(fn.__code__)
    called = [other for other in _known_custom() if other not in open_ and other != name
              and {other.partition("::")[0], other.partition("::")[2].partition(".")[0]} <= names]
    return "; ".join([own, *(f"calls {_describe(_overload(other), other, open_ | {name})}" for other in called)])


def _functions(held: list[Any], depth: int = 0) -> list[Any]:
    """The Python functions among what kernels are and hold (closures, containers)."""
    found = []
    for item in held:
        if hasattr(item, "__code__"):
            found.append(item)
            if depth < 4:
                found += _functions([_contents(c) for c in item.__closure__ or ()], depth + 1)
        elif isinstance(item, dict) and depth < 4:
            found += _functions(list(item.values()), depth + 1)
        elif isinstance(item, (list, tuple)) and depth < 4:
            found += _functions(list(item), depth + 1)
    return found


def _known_custom() -> list[str]:
    """Every operator with a Python kernel this process recorded or a ``custom_op``, by the
    dispatcher's name: the ones a kernel can call by name."""
    from torch._library.custom_ops import OPDEFS

    return sorted(STATE.kernels.keys() | set(OPDEFS))


def path_of(op: Any) -> tuple[str, str, str | None]:
    """Where another process finds ``op``: its namespace, name and overload (None for all of
    them: an ``OpOverloadPacket``)."""
    import torch

    if isinstance(op, torch._ops.OpOverloadPacket):
        namespace, _, name = op._qualified_op_name.partition("::")
        return namespace, name, None
    return op.namespace, op._schema.name.partition("::")[2], op._overloadname


def operator_at(namespace: str, name: str, overload: str | None) -> Any:
    """The operator at a ``path_of`` (AttributeError or RuntimeError where none is defined)."""
    import torch

    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def _overload(name: str) -> Any:
    """The overload the dispatcher names ``ns::name`` or ``ns::name.overload``."""
    namespace, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return operator_at(namespace, base, overload or "default")


def _recorded(name: str) -> dict[str, Recorded]:
    return STATE.kernels.get(name, {})


def _kept(op: Any, opdef: Any, torch_owned: bool) -> Iterator[tuple[str, Any]]:
    """The user functions torch keeps for ``op`` where Python can read them, by label (for
    torch's own operator, only what a user registers through ``torch.library``)."""
    from torch._library.simple_registry import singleton

    if opdef is not None:
        # CustomOpDef: its dispatcher kernels are proxies that call these.
        yield "custom_op", {name: value for name, value in vars(opdef).items()
                            if name.startswith("_") and name not in _CUSTOM_OP_BOOKKEEPING}
    entry = singleton.find(op._name)
    fakes = list(getattr(entry.fake_impl, "kernels", None) or ())
    if fakes:
        yield "fake", fakes[-1].func  # the one in force
    rules = getattr(entry.torch_dispatch_rules, "_data", None)
    if rules:
        yield "torch_dispatch rules", dict(rules)
    for table in () if torch_owned else ("py_kernels", "python_key_table", "functorch_table"):
        held = getattr(op, table, None)
        if held:
            yield table, dict(held)


# A CustomOpDef's attributes that are its own machinery, not what the user gave it: its
# library handle (C++, registrations this module reads on their own), its overload (named),
# and the name and schema (in the operator's name and the key's graph).
_CUSTOM_OP_BOOKKEEPING = frozenset({"_lib", "_opoverload", "_namespace", "_name", "_schema", "_qualname"})


def _custom_op_def(op: Any) -> Any:
    from torch._library.custom_ops import OPDEFS

    return OPDEFS.get(op._name)


def _kernel_reader(reads_identity: Any) -> Any:
    """How a kept or recorded kernel is described: a user's function by what it runs and reads
    (``reads_identity``); torch's machinery around one (``custom_op``'s device dispatch,
    ``register_autograd``'s generated autograd function and the record holding the user's
    backward) by torch's code, which torch's version fixes, and everything it holds, read
    the same way."""
    from torch._library.custom_ops import CustomOpDef
    from torch.library import Library

    from stableguards.identity.objects import identity

    open_: set[int] = set()  # what is being read: reached again, it is named (a class's back-reference)

    def read(obj: Any, depth: int = 0) -> str | None:
        if id(obj) in open_:
            return f"<cycle {getattr(obj, '__qualname__', type(obj).__qualname__)}>"
        if depth > 8:
            return None
        open_.add(id(obj))
        try:
            return _read(obj, depth)
        finally:
            open_.discard(id(obj))

    def _read(obj: Any, depth: int) -> str | None:
        if isinstance(obj, CustomOpDef):  # a proxy's own operator: described where it is kept
            return f"custom_op {obj._namespace}::{obj._name}"
        if isinstance(obj, Library):  # a registration handle: its registrations are read on their own
            return f"library {obj.ns}"
        if isinstance(obj, (staticmethod, classmethod)):
            return read(obj.__func__, depth + 1)
        if isinstance(obj, dict):
            items = [(identity(k) or read(k, depth + 1), read(v, depth + 1)) for k, v in obj.items()]
            if any(None in item for item in items):
                return None
            return "{" + ", ".join(sorted(f"{k}: {v}" for k, v in items)) + "}"
        if isinstance(obj, (list, tuple)):
            items = [read(v, depth + 1) for v in obj]
            return None if None in items else f"[{', '.join(items)}]"  # type: ignore[arg-type]
        if not _torchs(obj):
            return reads_identity(obj)
        if callable(obj) and hasattr(obj, "__code__"):
            # Its closure, less torch's flags (``_check_pystubs_once``'s "checked", which the first
            # call sets): the user's content is functions, records and values, never a bare bool.
            inner = [read(content, depth + 1) for cell in obj.__closure__ or ()
                     if type(content := _contents(cell)) is not bool]
            own = identity(obj.__code__)
            return None if own is None or None in inner else f"torch {obj.__qualname__}({own}; {', '.join(inner)})"
        described = reads_identity(obj)
        if described is not None or not hasattr(obj, "__dict__"):
            return described
        # A class torch made for the operator, or a record of torch's holding the user's functions.
        held = {name: value for name, value in vars(obj).items()
                if not (name.startswith("__") and name.endswith("__")) and name not in _TORCH_BOOKKEEPING}
        inner = read(held, depth + 1)
        return None if inner is None else f"torch {getattr(obj, '__qualname__', type(obj).__qualname__)}{inner}"

    return read


# What torch's own records hold that is this process's bookkeeping, not what the user gave:
# an autograd.Function class's id, from a per-process counter.
_TORCH_BOOKKEEPING = frozenset({"_autograd_function_id"})


def _torchs(obj: Any) -> bool:
    """Whether ``obj`` (a function, a class or an instance of one) is torch's own code."""
    module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    return isinstance(module, str) and module.partition(".")[0] == "torch"


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _dispatcher_name(op: Any) -> str:
    """``ns::name`` or ``ns::name.overload``: how the dispatcher and torch's registries name it."""
    return op._name


def _torch_owned(op: Any, name: str) -> bool:
    """Torch's own operator: defined by torch (in C++, or in its files), or a ``custom_op`` of
    torch's (its function is torch's code)."""
    opdef = _custom_op_def(op)
    if opdef is not None:
        return _torchs(opdef._init_fn)
    return op.namespace in _ALWAYS_TORCHS or _defined_by_torch(name)


@functools.lru_cache(maxsize=4096)  # an operator's definition does not move
def _defined_by_torch(name: str) -> bool:
    import torch

    defined = torch._C._dispatch_dump(name).partition("debug: registered at ")[2].partition("\n")[0]
    where = registrations(f"Schema: registered at {defined} :: ")
    return bool(where) and (not where[0].from_python or where[0].file.startswith(_torch_dir()))


@functools.cache
def _torch_dir() -> str:
    import torch

    return os.path.dirname(torch.__file__) + os.sep


# A custom operator's Python kernel, kept by torch in C++ only: recorded whatever the flag, as a
# library registers its operators when it is imported, before a compile sets the flag.
HOOKS = [Hook("torch.library", "Library.impl", None, _library_impl, params=("op_name", "fn", "dispatch_key"),
              records=True)]

__all__ = ["HOOKS", "Opaque", "custom_operators", "is_custom", "kernels", "operator_at", "path_of"]
