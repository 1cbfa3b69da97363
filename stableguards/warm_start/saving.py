"""Which check a guard of a saved entry is saved as: the guard-saving rule, in plain Python.

torch refuses to save an identity guard: an id means nothing in another process.
Each such guard is saved as a check that a restarted process can run
(``hooks.rebuilt_checks``, by name):

* ``*_BY_NAME``: torch's own check, on the object the saved scope names there (a
  module, a class, an importable function, a code object by its path).  What it
  proves beyond "the object of that name" is the entry's proof's (identities
  compared on the first call);
* ``ID_ON_FIRST_CALL``: an id check on an object no name finds in another process
  (an optimizer, a tensor a graph takes, an object whose id the trace used only as
  a key, a module copy, a tensor no graph holds), bound to the object at its source
  on the call the entry first serves, once the proof holds there;
* ``VERSION_ON_FIRST_CALL``: the version check on a dict holding tensors a graph takes;
* ``TYPE_ON_FIRST_CALL``: a type check on a class torch makes for one object
  (``register_parametrization``).

A guard is never dropped here: None means "saved as torch saves it".  Whether the
rebuilt checks prove what the live ones did is checked on the real trees
(``hooks.guards._serialize_guards``: the proof, then the round trip), not assumed
from this table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stableguards.identity.names import TENSOR, by_state, is_a, module_copy, parametrized

BY_NAME = {"MODULE_MATCH": "MODULE_BY_NAME", "CLASS_MATCH": "CLASS_BY_NAME", "CLOSURE_MATCH": "CLOSURE_BY_NAME",
           "FUNCTION_MATCH": "FUNCTION_BY_NAME", "ID_MATCH": "ID_BY_NAME", "CONSTANT_MATCH": "CONSTANT_BY_NAME"}
# What torch runs for each besides itself: an id check is what MODULE_MATCH and CLASS_MATCH run;
# CLOSURE_MATCH must not fall back to one.  A CONSTANT_MATCH is an id check only for a code
# object (a traced read of ``f.__code__``); on any other constant it is an EQUALS_MATCH,
# which torch saves as it is.
ID_CHECKS = {"MODULE_MATCH": ("ID_MATCH",), "CLASS_MATCH": ("ID_MATCH",), "FUNCTION_MATCH": ("ID_MATCH",),
             "CONSTANT_MATCH": ("ID_MATCH",)}


def replacement(kind: str, guard_types: frozenset[str], source: str, value: Callable[[], Any],
                bound: frozenset[str], versioned: frozenset[str], held: set[int]) -> str | None:
    """The name of the check a guard of ``kind`` (with ``guard_types``) at ``source`` is saved
    as, or None.  ``value`` reads the object it checks.

    An id check is bound on the entry's first call on an object whose identity is its state
    (``identity.names.by_state``: an optimizer), on a tensor a graph takes and an object whose
    id the trace used only as a key (at a source in ``bound``), on a module copy, and on a
    tensor no graph of the compile holds (ids ``held``): a parameter whose grad an optimizer
    hook reads.  Compiled code sees no more of such a tensor than its metadata (its values
    are read when it runs).  A tensor a graph holds under another source stays out (saved by
    name, it fails the proof).  The version check on a dict holding tensors a graph takes
    (at a source in ``versioned``) is bound likewise."""
    if kind == "ID_MATCH" and guard_types <= {kind}:
        obj = value()
        if source in bound or by_state(obj) or module_copy(obj) or (is_a(type(obj), TENSOR) and id(obj) not in held):
            return "ID_ON_FIRST_CALL"
    if kind == "DICT_VERSION" and source in versioned:
        return "VERSION_ON_FIRST_CALL"
    if kind == "TYPE_MATCH" and parametrized(type(value())):
        return "TYPE_ON_FIRST_CALL"
    if kind not in BY_NAME or not guard_types <= {kind, *ID_CHECKS.get(kind, ())}:
        return None
    return BY_NAME[kind]
