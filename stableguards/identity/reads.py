"""What a function computes, told the same way in every process: its code and what it reads.

The identity rule (``identity.objects``) describes a function by
its code, defaults and closure, and leaves the globals it reads to the guards
Dynamo installs for them.  A function that runs inside a compiled graph
without Dynamo tracing it (an ``fx.wrap``'d function, a saved-tensor hook, a
checkpointing policy) has no such guards: the AOTAutograd cache key is all
that stands between a changed program and a stale graph.  So ``Reads``
describes a function also by the value of every name its code reads: each
global (or builtin) it loads, and each attribute with a name its code uses on
a module or class it reaches (``helpers.K``, ``Config.SCALE``, ``a.b.c``),
each by this same rule, recursively.

torch's and the standard library's own functions, modules and classes are
described without what they read: their contents are fixed by torch's and
Python's versions, which every cache key holds.  An object with no identity
(a tensor, a module instance, code made by ``exec``) read anywhere makes the
whole description None: the graph stays bypassed.
"""

from __future__ import annotations

import builtins
import sys
import types
from typing import Any

from stableguards.components import digest_text
from stableguards.identity.names import module_of_globals
from stableguards.identity.objects import Identities

_VERSIONED = frozenset({"torch", "builtins", *sys.stdlib_module_names})


def reads_identity(obj: Any) -> str | None:
    """A description of ``obj`` equal in two processes only where it computes the same
    (its code and everything that code reads); None when it has none."""
    return Reads()(obj)


class Reads(Identities):
    """``Identities`` that also describe what each function reads (see the module docstring)."""

    def _function(self, fn: types.FunctionType) -> str | None:
        described = super()._function(fn)
        home = module_of_globals(fn.__globals__)
        if described is None or home is None or versioned(home):
            return described
        reads = self._reads(fn.__code__, fn.__globals__)
        return None if reads is None else f"{described}:reads#{digest_text(reads)[:32]}"

    def _reads(self, code: types.CodeType, scope: dict) -> str | None:
        names = code_names(code)
        builtin_scope = scope.get("__builtins__", builtins)
        builtin_scope = vars(builtin_scope) if isinstance(builtin_scope, types.ModuleType) else builtin_scope
        found: list[tuple[str, Any]] = []
        for name in sorted(names):
            if name in scope:
                found.append((name, scope[name]))
            elif name in builtin_scope:
                found.append((name, builtin_scope[name]))
            # else an attribute's name, or a global defined later (a NameError if the code gets there)
        # Attributes read from the modules and classes reached, by the names the code uses.
        queue = [value for _, value in found if _namespace(value)]
        seen: set[int] = set()
        while queue:
            space = queue.pop()
            if id(space) in seen or versioned(_module_name(space)):
                continue
            seen.add(id(space))
            scopes = [vars(k) for k in space.__mro__] if isinstance(space, type) else [vars(space)]
            for name in sorted(names):
                holder = next((s for s in scopes if name in s), None)
                if holder is None:
                    continue
                found.append((f"{_module_name(space)}:{getattr(space, '__qualname__', '')}.{name}", holder[name]))
                if _namespace(holder[name]):
                    queue.append(holder[name])
        described = self._all(value for _, value in found)
        if described is None:
            return None
        return "; ".join(f"{name}={d}" for (name, _), d in zip(found, described))


def hook_graph_identity(nodes: Any, code: str) -> str | None:
    """What a saved-tensor hook graph computes: its code, and the identity of every function it
    calls (by ``reads_identity``); None if a node reads state the code does not show (an
    attribute or a submodule of the graph) or calls something with no identity."""
    called = []
    for node in nodes:
        if node.op in ("get_attr", "call_module"):
            return None
        if node.op == "call_function":
            described = reads_identity(node.target)
            if described is None:
                return None
            called.append(described)
    return f"{code}|{'|'.join(called)}"


def code_names(code: types.CodeType) -> frozenset[str]:
    """Every global and attribute name a code object or the code nested in it uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return frozenset(names)


def versioned(module: str) -> bool:
    """Whether a module's contents are fixed by torch's or Python's version."""
    return module.partition(".")[0] in _VERSIONED


def _namespace(value: Any) -> bool:
    return isinstance(value, (types.ModuleType, type))


def _module_name(space: Any) -> str:
    return space.__name__ if isinstance(space, types.ModuleType) else getattr(space, "__module__", "") or ""
