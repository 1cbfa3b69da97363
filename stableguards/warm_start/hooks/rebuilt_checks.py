"""The checks a saved entry's guards are rebuilt with in another process, by builder name.

torch saves each guard with the name of its ``GuardBuilder`` method and calls
that method again when it loads the entry.  A saved entry names these instead
(``hooks.guards`` chooses, by ``warm_start.saving``): torch's own identity
checks under a name torch saves (``*_BY_NAME``), and checks bound on the call
the entry first serves (``*_ON_FIRST_CALL``).  Module-level: saved entries refer
to them by this module's path.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from stableguards.warm_start.guard_rules import FIRST_CALL, FIRST_CALLS_OBJECT, FIRST_CALLS_VERSION
from stableguards.warm_start.state import STATE, Binding, TypeBinding, VersionBinding


def _same_check_as(kind: str) -> Any:
    def check(builder: Any, guard: Any) -> None:
        getattr(type(builder), kind)(builder, guard)

    check.__name__ = check.__qualname__ = kind.replace("_MATCH", "_BY_NAME")
    return check


# torch's own check, under a name torch saves; module-level so the saved entry
# refers to it by name.
MODULE_BY_NAME = _same_check_as("MODULE_MATCH")
CLASS_BY_NAME = _same_check_as("CLASS_MATCH")
CLOSURE_BY_NAME = _same_check_as("CLOSURE_MATCH")
CONSTANT_BY_NAME = _same_check_as("CONSTANT_MATCH")
ID_BY_NAME = _same_check_as("ID_MATCH")
FUNCTION_BY_NAME = _same_check_as("FUNCTION_MATCH")


def ID_ON_FIRST_CALL(builder: Any, guard: Any) -> None:  # noqa: N802 - named as torch's builder methods
    """An id check, in another process, on an object that no name finds there (an
    optimizer, a tensor, a module copy: ``saving.replacement``): bound to the object at its
    source on the call the entry first serves, when the entry's proof shows that object's
    identity is the cold one's (``proofs`` binds it, ``identity`` describes it).  Until
    then it passes, and nothing is served before the proof: a loaded entry serves only
    once its proof holds.  From then on it checks that object, as the cold compile's id
    check did; what the cold compile saw of it, the proof compared."""
    from torch._dynamo.guards import _safe_type_repr

    binding = Binding()
    if (building := STATE.loading.get().bindings) is not None:
        building[guard.name] = binding
    type_repr = _safe_type_repr(type(builder.get(guard)))
    _add_bound_check(builder, guard, binding,
                     f"___check_obj_id({builder.arg_ref(guard)}, {FIRST_CALLS_OBJECT}), type={type_repr}")


def TYPE_ON_FIRST_CALL(builder: Any, guard: Any) -> None:  # noqa: N802 - named as torch's builder methods
    """A type check, in another process, on an object of a class torch makes for one object
    (``identity.parametrized``), which no name finds there: bound to the class of the object
    at its source on the call the entry first serves, when the entry's proof shows that class
    is what the cold one was (``identity._parametrized``).  Until then it passes, and nothing
    is served before the proof holds; from then on it checks that class, as the cold
    compile's type check did."""
    from torch._dynamo.guards import _safe_type_repr

    type_repr = _safe_type_repr(type(builder.get(guard)))
    _add_bound_check(builder, guard, TypeBinding(),
                     f"___check_type_id({builder.arg_ref(guard)}, {FIRST_CALLS_OBJECT}), type={type_repr}")


def VERSION_ON_FIRST_CALL(builder: Any, guard: Any) -> None:  # noqa: N802 - named as torch's builder methods
    """A dict's version check, in another process, on an optimizer's per-parameter state
    dict whose tensors a graph takes (``graph_params``): bound to the version the dict has
    on the call the entry first serves, when the entry's proof shows the dict holds what
    the cold one did (its keys, and its tensors by what the compiled code sees of them:
    ``first_call.state_dict_fact``).  A version belongs to one dict in one state (PEP 509), so
    from then on it checks what the cold compile's version check did: the same dict,
    unchanged, holding the tensors the graph is given."""
    from torch._C._dynamo.guards import dict_version

    _add_bound_check(builder, guard, VersionBinding(dict_version),
                     f"___dict_version({builder.arg_ref(guard)}) == {FIRST_CALLS_VERSION}")


def _add_bound_check(builder: Any, guard: Any, binding: Binding, code: str) -> None:
    """A check bound on the entry's first call: one string literal (torch evaluates a failed
    guard's code parts to name it), found again by its token when the proof binds it.

    A dict's guard manager takes no lambda guard: the check on a dict sits on its nearest
    ancestor that is not one, reading the dict along the source's attribute and item
    accesses from there (``binding.at`` names the dict's source for the proof)."""
    STATE.bindings[binding.token] = binding
    text = f"{FIRST_CALL}{binding.token}: {code}"
    manager, source, check = builder.get_guard_manager(guard), guard.originating_source, binding.passes
    if type(manager).__name__ == "DictGuardManager":
        base = source
        while type(manager).__name__ == "DictGuardManager":
            base = getattr(base, "base", None)
            if base is None or not source.name.startswith(base.name):
                raise NotImplementedError(f"no guard manager above {source.name} takes a check")
            manager = builder.get_guard_manager_from_source(base)
        read = _reader(source.name[len(base.name):])
        binding.at = source.name
        check = lambda obj: binding.passes(read(obj))  # noqa: E731
    manager.add_lambda_guard(check, [repr(text)], guard.user_stack)


def _reader(path: str) -> Callable[[Any], Any]:
    """What ``obj<path>`` reads (``.__dict__['id2label']``): attribute and constant-key item
    accesses only, else NotImplementedError (the saved guards then do not load back, and the
    entry is left out)."""
    node = ast.parse(f"obj{path}", mode="eval").body
    steps: list[tuple[bool, Any]] = []
    while not isinstance(node, ast.Name):
        if isinstance(node, ast.Attribute):
            steps.append((True, node.attr))
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            steps.append((False, node.slice.value))
            node = node.value
        else:
            raise NotImplementedError(f"cannot read obj{path} without evaluating it")
    steps.reverse()

    def read(obj: Any) -> Any:
        for attribute, key in steps:
            obj = getattr(obj, key) if attribute else obj[key]
        return obj
    return read
