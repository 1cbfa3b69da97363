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
* ``id()`` of an object the frame reaches (``BuiltinVariable.call_id``): its
  address, a constant behind an id check.  Where the trace only hashes it and
  compares it with other ids (``copy.deepcopy``'s memo), it stands for "this
  object", not a number (``memo_key``);
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

import contextvars
import functools
import sys
from typing import Any

from stableguards.hooks.core import Hook
from stableguards.warm_start.facts import ADDRESS, SEED, per_process
from stableguards.warm_start.state import STATE

_VARIABLES = "torch._dynamo.variables"


def _note(what: str, depends: str | None) -> None:
    traced = STATE.compiling.get().traced
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
    traced = STATE.compiling.get().traced
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
    traced = STATE.compiling.get().traced
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


def _id(call: Any, self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """``id(x)`` of an object the frame reaches, folded to its address: a memo key (``memo_key``)."""
    result = call(self, tx, *args, **kwargs)
    traced = STATE.compiling.get().traced
    source = getattr(args[0], "source", None) if len(args) == 1 else None
    if traced is None or type(result).__name__ != "ConstantVariable" or type(result.value) is not int:
        return result
    if source is not None:
        traced.memo_keys.add(source.name)
    return memo_key(result.value, f"id({source.name if source is not None else type(args[0]).__name__})")


@functools.cache
def _memo_key_class() -> type:
    from torch._dynamo.variables.constant import ConstantVariable, FakeIdVariable
    from torch._dynamo.variables.object_protocol import vt_identity_compare

    identity_compare = vt_identity_compare.__code__

    class MemoKey(ConstantVariable):
        """An address Dynamo folded for ``id(x)``, as torch's constant, that notes any use of it
        but as a key: hashed (``hash_impl``), or compared for equality with another id (its own
        kind or a ``FakeIdVariable``).  Any other read of its value (arithmetic, a repr, a
        comparison with a number, the compiled code loading it) makes what the trace computed
        depend on the address, and is noted (``facts.ADDRESS``): the entry is left out.  A
        key's use depends only on which objects are one, which the proof compares
        (``guard_rules.one_object``)."""

        _nonvar_fields = {"what", *ConstantVariable._nonvar_fields}

        def __init__(self, value: Any = None, *, what: str = "id()", **kwargs: Any) -> None:
            self.what = what
            super().__init__(value, **kwargs)

        @property
        def value(self) -> int:
            if not _AS_KEY.get():
                _note(f"{self.what}, read as a number", ADDRESS)
            return self.__dict__["_address"]

        @value.setter
        def value(self, value: int) -> None:
            self.__dict__["_address"] = value

        def clone(self, **kwargs: Any) -> Any:
            return MemoKey(self.__dict__["_address"], what=self.what, **{"source": self.source, **kwargs})

        def hash_impl(self, tx: Any) -> tuple[int, bool]:
            token = _AS_KEY.set(True)
            try:
                return super().hash_impl(tx)
            finally:
                _AS_KEY.reset(token)

        def python_type(self) -> type:
            return int

        def get_real_python_backed_value(self) -> object:
            """For ``is`` (``vt_identity_compare``, which a key lookup tries before ``==``): true
            only of one int object.  Any other caller reads the number (an int's descriptor:
            ``id(x).real``)."""
            if sys._getframe(1).f_code is not identity_compare:
                _note(f"{self.what}, read as a number", ADDRESS)
            return self.__dict__["_address"]

        def tp_richcompare_impl(self, tx: Any, other: Any, op: str) -> Any:
            if op in ("__eq__", "__ne__") and isinstance(other, (MemoKey, FakeIdVariable)):
                same = self.__dict__["_address"] == (other.__dict__["_address"] if isinstance(other, MemoKey)
                                                     else other.value)
                return ConstantVariable.create(same == (op == "__eq__"))
            return super().tp_richcompare_impl(tx, other, op)

    return MemoKey


def memo_key(address: int, what: str) -> Any:
    """``id(x)`` folded while tracing for a saved entry (``_id``), as a ``MemoKey``."""
    return _memo_key_class()(address, what=what)


_AS_KEY: contextvars.ContextVar[bool] = contextvars.ContextVar("stableguards_as_key", default=False)


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
    Hook(f"{_VARIABLES}.builtin", "BuiltinVariable.call_id", "warm_start", _id, params=("tx",)),
]

__all__ = ["HOOKS", "SEED"]
