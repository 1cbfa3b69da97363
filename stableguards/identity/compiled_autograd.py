"""What a function compiled autograd puts in its graphs runs, told the same way in every process.

Shared: AOTAutograd's key (``autograd_cache``) names such functions by it, and warm start
finds the module of a graph module's globals that hold them (``identity.fx_home``).
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

from stableguards.codes import code_digest
from stableguards.components import digest_text
from stableguards.identity.names import module_of_globals
from stableguards.identity.objects import Identities
from stableguards.identity.reads import code_names, versioned


def compiled_autograd_identity(target: Any) -> str | None:
    """What a function compiled autograd puts in its graphs runs, told the same way in every
    process; None for anything else.

    * An op it binds from the C++ engine (``validate_outputs``, a built-in node's
      ``apply_functional``): bound once per process, under its name, to the C++ function of
      that name in this torch build, so the name and torch's version (in every key) say what
      it runs; AOTAutograd traces it into aten operators the key holds.  A C++ custom
      function (``CppNode<name><n>``: an extension's code, numbered in the order a process
      bound them) has no such identity, nor has a node an extension defines, and a
      non-traceable op runs a wrapper torch never caches.  Checked on the object: one of
      compiled autograd's ``Op``s, bound as ``ops.<name>``, named for one of torch's node
      types (``torch._C._functions``) or the engine's ``validate_outputs``.
    * The prologue of a compiled forward's backward (``call_aot_bwd_prologue``, made for
      each backward graph it inlines): torch's closure over the function AOTAutograd
      generated from the forward's metadata.  Described by both codes and every global the
      generated code reads, each plain data (``_plain``), but for the compile id and the
      stack traces, which torch passes to ``process_runtime_tangent`` for its error message
      only (a forward loaded from the cache in another process keeps the stack traces and
      gets its own compile id).
    """
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    if module is None:
        return None  # nothing compiled autograd made can be in a graph
    if type(target) is getattr(module, "Op", None):
        name = target.__name__
        engine = name in _ENGINE_FUNCTIONS or hasattr(sys.modules["torch"]._C._functions, name)
        bound = engine and not target.is_custom_function and getattr(module.ops, name, None) is target
        return f"compiled-autograd-op:{name}" if bound else None
    if not (isinstance(target, types.FunctionType) and target.__module__ == module.__name__
            and target.__qualname__.endswith("<locals>.call_aot_bwd_prologue")
            and target.__code__.co_freevars == ("bw_prologue_fn",)):
        return None
    generated = target.__closure__[0].cell_contents
    if (not isinstance(generated, types.FunctionType) or module_of_globals(generated.__globals__) is not None
            or generated.__closure__ or generated.__defaults__ or generated.__kwdefaults__):
        return None  # not code AOTAutograd generated: all it reads is its globals
    identities, parts = Identities(), []
    for name in sorted(code_names(generated.__code__) & generated.__globals__.keys() - _MESSAGE_ONLY):
        described = _plain(generated.__globals__[name], identities)
        if described is None:
            return None
        parts.append(f"{name}={described}")
    return (f"compiled-autograd-prologue:{code_digest(target.__code__)}:{code_digest(generated.__code__)}:"
            f"{digest_text('; '.join(parts))}")


# Functions of compiled autograd's engine it binds as ops, besides one per node type.
_ENGINE_FUNCTIONS = frozenset({"validate_outputs"})
# Globals of AOTAutograd's generated backward prologue read only for an error message.
_MESSAGE_ONLY = frozenset({"_compile_id_", "_stack_traces_"})


def _plain(value: Any, identities: Identities) -> str | None:
    """``identities``' description of ``value``, where an instance of one of torch's dataclasses
    (AOTAutograd's tangent metadata and descriptors) is its class and its fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and versioned(type(value).__module__):
        owner = identities.describe(type(value))
        fields = [_plain(getattr(value, f.name), identities) for f in dataclasses.fields(value)]
        if owner is None or None in fields:
            return None
        return f"{owner}({', '.join(fields)})"
    if type(value) in (list, tuple):
        items = [_plain(item, identities) for item in value]
        return None if None in items else f"{type(value).__name__}({', '.join(items)})"
    return identities.describe(value)
