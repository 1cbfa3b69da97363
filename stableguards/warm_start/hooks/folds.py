"""Values a trace for a saved entry folds that differ between two processes of one program.

Dynamo computes some values while it traces and puts them in the graph as
constants, with no guard (torch 2.15, read in ``variables/builtin.py``,
``constant.py``, ``sets.py``, ``user_defined.py`` and ``misc.py``):

* ``hash()`` of a constant (``BuiltinVariable.call_hash``): a string's hash
  depends on the process's hash seed; an object's default hash, and None's
  before Python 3.12, on its address;
* the order a set or frozenset constant iterates in (``ConstantVariable.create``
  lists it once: a frozenset literal in the code, a global set of strings,
  whose ``EQUALS_MATCH`` ignores order), which shows where a set is iterated,
  and a set's repr (``tp_repr_impl``);
* an object's default repr (``... at 0x7f...``) and anything made from an id
  (``FakeIdVariable``);
* a random generator's state (``RandomVariable``): copied from a live one
  (``random.shuffle``) or drawn from the OS (an unseeded ``random.Random()``),
  and replayed by the compiled code.

``os.getpid()``, thread ids and time reads break the graph (the resumed frame
guards the value it got); ``random.random()`` is a graph input, read through a
global torch installs per process (``guards._unrestored`` leaves it out); the
process's place in its job is ``guards._record_folded``'s.  Each hook here
notes what the value depends on (``facts.per_process``): the hash seed becomes
a fact of the entry, checked before it serves (``facts.HASH_SEED``); an address
or a generator's state leaves the entry out, named.
"""

from __future__ import annotations

from typing import Any

from stableguards.hooks.core import Hook
from stableguards.warm_start.facts import ADDRESS, SEED, per_process
from stableguards.warm_start.state import STATE

_VARIABLES = "torch._dynamo.variables"


def _note(what: str, depends: str | None) -> None:
    traced = STATE.traced.get()
    if traced is not None and depends is not None:
        traced.per_process.setdefault(depends, what)


def _constant(variable: Any) -> tuple[bool, Any]:
    try:
        return True, variable.as_python_constant()
    except Exception:  # noqa: BLE001 - NotImplementedError, or a tracker's own refusal
        return False, None


def _hash(call: Any, self: Any, tx: Any, arg: Any, *args: Any, **kwargs: Any) -> Any:
    """``hash(x)`` folded: of a constant, what its hash depends on; of an object whose hash is
    its address (the default ``__hash__``), that.  A ``__hash__`` Dynamo traced folds the
    hashes it computes on its own (they come here too)."""
    result = call(self, tx, arg, *args, **kwargs)
    known, value = _constant(arg)
    if known:
        _note(f"hash({value!r:.60})", per_process(value))
    elif type(result).__name__ == "FakeIdVariable" or getattr(type(getattr(arg, "value", None)), "__hash__", None) \
            is object.__hash__:
        _note(f"hash() of {type(getattr(arg, 'value', arg)).__name__}, its address", ADDRESS)
    return result


def _set_constant(call: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    """A set or frozenset constant, listed in the order this process iterates it in: noted for
    ``_set_iterated``.  Its order matters only where a set is iterated (``k in {"a", "b"}``
    does not iterate it)."""
    traced = STATE.traced.get()
    if traced is not None and type(value) in (set, frozenset):
        depends = per_process(value)
        if depends is not None:
            traced.hash_ordered.setdefault(depends, f"the order {value!r:.60} iterates in")
    return call(value, *args, **kwargs)


def _set_iterated(call: Any, self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """A set iterated.  Dynamo's sets iterate in the order their items went in, which is the
    program's, unless they came from a set constant of this trace, in this process's hash
    order, directly or through set operations (which insert in iteration order): so where
    the trace made such a constant, a set of items whose hashes depend on the process is
    noted as depending on it."""
    traced = STATE.traced.get()
    if traced is not None and traced.hash_ordered:
        known, value = _constant(self)
        depends = per_process(value) if known else None
        if depends is not None:
            _note(traced.hash_ordered.get(depends) or next(iter(traced.hash_ordered.values())), depends)
    return call(self, tx, *args, **kwargs)


def _set_repr(call: Any, self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """A set's repr, in the order its items hash to."""
    known, value = _constant(self)
    _note(f"repr({value!r:.60})" if known else "the repr of a set", per_process(value) if known else ADDRESS)
    return call(self, tx, *args, **kwargs)


def _object_repr(call: Any, self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """An object's repr: the default one names its address."""
    result = call(self, tx, *args, **kwargs)
    known, text = _constant(result)
    if not known or " at 0x" in str(text):
        _note(f"the repr of a {type(getattr(self, 'value', self)).__name__}, with its address", ADDRESS)
    return result


def _id_repr(call: Any, self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """The repr of an id (``str(id(x))``)."""
    _note("the repr of an id", ADDRESS)
    return call(self, tx, *args, **kwargs)


def _random_state(call: Any, self: Any, rand: Any = None, seed: Any = None, *args: Any, **kwargs: Any) -> None:
    """A random generator whose state the compiled code replays: one copied from a live
    generator, or an unseeded one (seeded from the OS).  A constant seed is the program's."""
    call(self, rand, seed, *args, **kwargs)
    if rand is not None or seed is None:
        _note("a random generator's state", ADDRESS)


HOOKS = [
    Hook(f"{_VARIABLES}.builtin", "BuiltinVariable.call_hash", "warm_start", _hash, params=("tx", "arg")),
    Hook(f"{_VARIABLES}.constant", "ConstantVariable.create", "warm_start", _set_constant, params=("value",)),
    Hook(f"{_VARIABLES}.sets", "BaseSetVariable.tp_iter_impl", "warm_start", _set_iterated, params=("tx",)),
    Hook(f"{_VARIABLES}.sets", "BaseSetVariable.unpack_var_sequence", "warm_start", _set_iterated, params=("tx",)),
    Hook(f"{_VARIABLES}.sets", "SetVariable.tp_repr_impl", "warm_start", _set_repr, params=("tx",)),
    Hook(f"{_VARIABLES}.sets", "FrozensetVariable.tp_repr_impl", "warm_start", _set_repr, params=("tx",)),
    Hook(f"{_VARIABLES}.user_defined", "UserDefinedObjectVariable.tp_repr_impl", "warm_start", _object_repr,
         params=("tx",)),
    Hook(f"{_VARIABLES}.constant", "FakeIdVariable.tp_repr_impl", "warm_start", _id_repr, params=("tx",)),
    Hook(f"{_VARIABLES}.misc", "RandomVariable.__init__", "warm_start", _random_state, params=("rand", "seed")),
]

__all__ = ["HOOKS", "SEED"]
