"""What a loaded entry binds on the call it first serves, and the facts written about it.

Checks a restarted process cannot make by name (an optimizer's id, a tensor a graph
takes, a dict's version, a parametrized class) are saved bound on the entry's first
call (``rebuilt_checks``).  On that call the proof binds each to the object at its
source and writes the check it stands for, so the proof compares what that object is
with the cold one; a refusal unbinds what it bound (``proofs.verify``).
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from stableguards.hooks.guard_tree import Leaf
from stableguards.identity.names import by_state, graph_tensor, module_copy
from stableguards.identity.objects import Identities
from stableguards.warm_start.facts import graph_tensors
from stableguards.warm_start.guard_rules import FIRST_CALL, FIRST_CALLS_OBJECT, Fact, Unprovable, code_of, fact
from stableguards.warm_start.state import STATE, Binding


def bind(binding: Binding, obj: Any, made: list[Binding]) -> bool:
    """Bind ``binding`` to ``obj`` unless bound (recorded in ``made`` if this bound it);
    whether it now checks ``obj``."""
    fresh = not binding.bound
    holds = binding.bind(obj)
    if fresh:
        made.append(binding)
    return holds


def bound_on_first_call(obj: Any) -> bool:
    """Whether an id check on ``obj`` is one bound on its entry's first call, each on its own
    (``one_object``): an optimizer's, a tensor's, a module copy's."""
    import torch

    return by_state(obj) or isinstance(obj, torch.Tensor) or module_copy(obj)


class Bound:
    """What an entry binds on its first call, and what its tree checks: the tensors its
    graphs take in front of their inputs (``graph_params``: their sources, the objects there
    on this call), the dicts whose version checks are bound because they hold some of them
    (cold: given; warm: told by the loaded checks), and every source the tree checks."""

    def __init__(self, graph_params: Iterable[tuple[str, tuple[str, ...]]], value: Callable[[str], Any],
                 tree: list[Leaf], first_call: frozenset[str] = frozenset(),
                 versioned: frozenset[str] = frozenset(), made: list[Binding] | None = None) -> None:
        self.made: list[Binding] = [] if made is None else made  # the checks this call's proof bound
        self.sources = frozenset(source for _, sources in graph_params for source in sources)
        self.first_call = first_call
        self.versioned = versioned
        self.checked = frozenset(leaf.source for leaf in tree)
        self._value = value
        self._ids: set[int] | None = None

    def identity(self, source: str, identities: Identities, first_call: bool) -> Callable[[Any], str | None]:
        """How the object an id check at ``source`` checks is described: a tensor, where the
        check is bound on the first call, by what compiled code sees of it; an optimizer
        without the hyperparameters the tree checks at their own sources
        (``Identities.optimizer``); anything else by ``identities``."""
        def guarded(group: int, key: str) -> bool:
            return f"{source}.param_groups[{group}][{key!r}]" in self.checked

        def describe(obj: Any) -> str | None:
            if first_call and (tensor := graph_tensor(obj)) is not None:
                return tensor
            if by_state(obj):
                return identities.optimizer(obj, guarded)
            # Bound on the first call, an object with no identity of its own (its id a memo key:
            # folds.memo_key) is described by its class and what it holds.
            return identities(obj) or (identities.contents(obj) if first_call else None)
        return describe

    def bound_here(self, source: str, obj: Any) -> bool:
        """Whether the id check at ``source`` is bound on the entry's first call (``one_object``)."""
        return source in self.first_call or bound_on_first_call(obj)

    def holds(self, obj: Any) -> bool:
        """Whether ``obj`` is a tensor some graph of the entry takes, on this call."""
        if self._ids is None:
            self._ids = {id(self._value(source)) for source in self.sources}
        return id(obj) in self._ids


def graph_tensors_fact(graph: str, sources: tuple[str, ...], value: Callable[[str], Any]) -> Fact:
    return graph_tensors(graph, [(source, value(source)) for source in sources], graph_tensor,
                         lambda tensor: tensor.untyped_storage()._cdata)


def state_dict_fact(source: str, obj: Any, bound: Bound, identities: Identities) -> Fact:
    """A dict whose version check is bound on the entry's first call (``guards.
    VERSION_ON_FIRST_CALL``): its keys in order and its values, a tensor only as one a graph
    of the entry takes (by what its compiled code sees of it; ``GRAPH_TENSORS`` says more).
    A version proves nothing of what a dict held in another process: this does."""
    import torch

    if type(obj) is not dict:
        raise Unprovable(f"{source} is a {type(obj).__name__}, not a dict")
    items = []
    for key, item in obj.items():
        if isinstance(item, torch.Tensor) and not bound.holds(item):
            raise Unprovable(f"{source}[{key!r}] is a tensor no graph of the entry takes")
        described = graph_tensor(item) if isinstance(item, torch.Tensor) else identities(item)
        if type(key) is not str or described is None:
            raise Unprovable(f"{source}[{key!r}] has no identity that holds in another process")
        items.append(f"{key!r}: {described}")
    return Fact(source, "DICT_VERSION",
                f"unchanged from its entry's first call, on which it held {{{', '.join(items)}}}")


def first_call_text(code: str) -> str | None:
    """The text of an id check bound on its entry's first call (a string literal), or None."""
    if not code.startswith(("'", '"')):
        return None
    with contextlib.suppress(ValueError, SyntaxError):
        text = ast.literal_eval(code)
        if isinstance(text, str) and text.startswith(FIRST_CALL):
            return text
    return None


def first_call_source(leaf: Leaf) -> str | None:
    """The source a loaded check bound on its entry's first call checks, or None."""
    if leaf.kind != "LAMBDA_GUARD" or (text := first_call_text(code_of(leaf.parts))) is None:
        return None
    return bound_check(text, leaf.source)[1]


def bound_check(text: str, source: str) -> tuple[Binding | None, str, str]:
    """A bound check's binding (None: not made in this process), the source it checks (its
    guard's, unless it sits on an ancestor's manager: ``Binding.at``) and its code template."""
    token, _, template = text.removeprefix(FIRST_CALL).partition(": ")
    binding = STATE.bindings.get(int(token))
    return binding, (binding.at if binding is not None else None) or source, template


def first_call_fact(source: str, text: str, value: Callable[[str], Any], described: Callable[[Any], str | None],
                     bound: Bound, identities: Identities) -> Fact:
    """A loaded check bound on its entry's first call (``rebuilt_checks.ID_ON_FIRST_CALL``,
    ``VERSION_ON_FIRST_CALL``): bound here to the object at its source on this call, whose
    proof is being checked, and written as the check it stands for.  The proof then
    compares what that object is with the cold one; if it differs, the entry never serves."""
    binding, source, template = bound_check(text, source)
    obj = value(source)
    try:
        bound_here = binding is not None and bind(binding, obj, bound.made)
    except TypeError:  # no version
        bound_here = False
    if not bound_here:
        raise Unprovable(f"{source}: its check is bound to another object")
    if template.startswith("___dict_version("):
        return state_dict_fact(source, obj, bound, identities)
    from torch._dynamo.guards import _safe_type_repr

    # The type torch's id check prints is the checked object's: the bound one's (where the guards
    # were built, a tensor is the saved state's fake one).
    code = f"{template.rpartition(', type=')[0]}, type={_safe_type_repr(type(obj))}"
    if template.startswith("___check_type_id("):  # TYPE_ON_FIRST_CALL: what the object's class is
        return fact(source, "TYPE_MATCH", [code.replace(FIRST_CALLS_OBJECT, str(id(type(obj))))],
                    value=lambda: obj, identity=identities)
    return fact(source, "ID_MATCH", [code.replace(FIRST_CALLS_OBJECT, str(id(obj)))], value=lambda: obj,
                identity=described)
