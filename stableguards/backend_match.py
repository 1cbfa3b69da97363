"""BACKEND_MATCH: which compiled code may be served to which backend.

torch 2.13 matches a cache entry to the calling backend in C++: the same
object, or the same type and ``==``.  A backend rebuilt for each
``torch.compile`` call (``aot_autograd(fw_compiler=...)``) then never matches,
a loose ``__eq__`` can serve code compiled with other options, and nothing
names a backend across processes.

Here a backend is described by what it *is*, not by which object it happens to
be: its registered name, or the code of the callable, plus every option,
closure value, default and global it depends on.  The description is
canonical (sorted dicts, no addresses, no ``hash()``), hashed with xxh3-128
into a fingerprint that is the same in every process for the same
configuration.  Where some part cannot be described soundly (a tensor in a
closure, an object without a readable state, a mutable global), the
fingerprint falls back to the backend object's identity: two such backends
never share, so sharing is never wrong.

Equal fingerprints are interned to one ``BackendKey`` object per process, and
that key is what the cache entries hold: matching stays a pointer comparison
in C++ (no Python call on the hot path), and the entries do not keep the
backend itself alive.
"""

from __future__ import annotations

import enum
import functools
import re
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import xxhash

from stableguards.pgo.identity import code_fingerprint

# Bounds on how much of an object graph a description may walk.
_MAX_DEPTH = 12
_MAX_NODES = 5_000

_SCALARS = (type(None), bool, int, float, complex, bytes)
# Default reprs embed an address ("<Foo object at 0x7f...>"; torch uses str(backend)
# as a compiler name).  An address names an object, never a configuration: the
# object's state is described where the object itself is.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class Unfingerprintable(Exception):
    """A part of the backend whose behaviour cannot be captured by a description."""


@dataclass(frozen=True)
class BackendFingerprint:
    """What identifies a backend configuration.

    ``digest`` is stable across processes unless ``stable`` is False, in which
    case it encodes this process's object identity and ``reason`` says why.
    """

    digest: str
    description: str
    stable: bool = True
    reason: str = ""

    def __str__(self) -> str:
        short = self.description if len(self.description) <= 160 else self.description[:157] + "..."
        suffix = "" if self.stable else f" [identity only: {self.reason}]"
        return f"{short} #{self.digest[:12]}{suffix}"


def fingerprint(backend: object, name_of: Callable[[object], str | None] = lambda _: None) -> BackendFingerprint:
    """Fingerprint a backend; ``name_of`` names well-known objects (registered backends)."""
    try:
        tree = _Describer(name_of).describe(backend, 0)
    except Unfingerprintable as why:
        label = getattr(backend, "__qualname__", type(backend).__qualname__)
        return BackendFingerprint(f"id-{id(backend):x}", f"{label} (object {id(backend):#x})",
                                  stable=False, reason=str(why))
    text = repr(tree)
    return BackendFingerprint(xxhash.xxh3_128_hexdigest(text.encode()), _readable(tree))


class BackendKey:
    """The per-process token for one backend configuration; cache entries hold this.

    Interned by fingerprint digest (see ``key_for``), so equal configurations
    get the same object and identity is equality.  It also tracks which user
    backends of this configuration are alive: code compiled for a
    configuration is kept while at least one of them lives (``watch``).
    """

    __slots__ = ("fingerprint", "_live", "_immortal", "_on_last_gone", "__weakref__")

    def __init__(self, fp: BackendFingerprint) -> None:
        self.fingerprint = fp
        self._live: set[int] = set()
        self._immortal = False
        self._on_last_gone: Callable[[BackendKey], None] | None = None

    def watch(self, backend: object | None, on_last_gone: Callable[[BackendKey], None]) -> None:
        """Call ``on_last_gone(self)`` once no watched backend of this configuration is alive.

        ``None`` (a registered backend, which lives as long as the process) and
        objects that cannot be weakly referenced keep the configuration alive
        for good, as torch itself does for every backend.
        """
        self._on_last_gone = on_last_gone
        if backend is None:
            self._immortal = True
            return
        if id(backend) in self._live:
            return
        try:
            weakref.finalize(backend, self._gone, id(backend))
        except TypeError:
            self._immortal = True
            return
        self._live.add(id(backend))

    @property
    def alive(self) -> bool:
        return self._immortal or bool(self._live)

    def _gone(self, backend_id: int) -> None:
        self._live.discard(backend_id)
        if not self.alive and self._on_last_gone is not None:
            self._on_last_gone(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fingerprint})"


_keys: weakref.WeakValueDictionary[str, BackendKey] = weakref.WeakValueDictionary()


def key_for(fp: BackendFingerprint, cls: type[BackendKey] = BackendKey) -> BackendKey:
    """The one live key for this fingerprint, made (as ``cls``) if there is none."""
    key = _keys.get(fp.digest)
    if key is None:
        key = _keys[fp.digest] = cls(fp)
    return key


class _Describer:
    def __init__(self, name_of: Callable[[object], str | None]) -> None:
        self.name_of = name_of
        self.nodes = 0
        self.stack: list[int] = []

    def describe(self, obj: Any, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > _MAX_NODES or depth > _MAX_DEPTH:
            raise Unfingerprintable("configuration too large to describe")
        if isinstance(obj, str):
            return _ADDRESS.sub(" at 0x?", obj)
        if isinstance(obj, _SCALARS):
            return obj if not isinstance(obj, float) else ("float", repr(obj))
        name = self.name_of(obj)
        if name is not None:
            return ("named", name)
        if id(obj) in self.stack:
            return ("cycle", len(self.stack) - self.stack.index(id(obj)))
        self.stack.append(id(obj))
        try:
            return self._describe_object(obj, depth + 1)
        finally:
            self.stack.pop()

    def _describe_object(self, obj: Any, depth: int) -> Any:
        d = functools.partial(self.describe, depth=depth)
        if isinstance(obj, (tuple, list)):
            return (type(obj).__name__, tuple(d(v) for v in obj))
        if isinstance(obj, dict):
            items = [(d(k), d(v)) for k, v in obj.items()]
            return ("dict", tuple(sorted(items, key=repr)))
        if isinstance(obj, (set, frozenset)):
            return ("set", tuple(sorted((d(v) for v in obj), key=repr)))
        if isinstance(obj, enum.Enum):
            return ("enum", _qualified(type(obj)), obj.name)
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        if isinstance(obj, type):
            return ("class", _qualified(obj), self._class_code(obj))
        if isinstance(obj, types.FunctionType):
            return self._function(obj, depth)
        if isinstance(obj, types.MethodType):
            return ("method", d(obj.__self__), d(obj.__func__))
        if isinstance(obj, functools.partial):
            return ("partial", d(obj.func), d(obj.args), d(obj.keywords))
        if isinstance(obj, types.BuiltinFunctionType):
            self_ = getattr(obj, "__self__", None)
            owner = None if self_ is None or isinstance(self_, types.ModuleType) else d(self_)
            return ("builtin", getattr(obj, "__module__", None), obj.__qualname__, owner)
        cls = type(obj)
        if any(_qualified(c) == "torch.Tensor" for c in cls.__mro__):
            raise Unfingerprintable("holds a tensor")
        if not hasattr(obj, "__dict__") and cls.__module__.startswith("torch") \
                and cls.__repr__ is not object.__repr__:
            # torch value types whose repr is their whole state (dtype, device, layout).
            return ("torch", _qualified(cls), repr(obj))
        if not isinstance(getattr(obj, "__dict__", None), dict) or _has_slot_state(cls):
            raise Unfingerprintable(f"{_qualified(cls)} has state outside its __dict__")
        return ("object", d(cls), d(dict(vars(obj))))

    def _function(self, fn: types.FunctionType, depth: int) -> Any:
        d = functools.partial(self.describe, depth=depth)
        closure = ()
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
            try:
                closure += ((name, d(cell.cell_contents)),)
            except ValueError:  # an empty cell
                closure += ((name, ("empty",)),)
        referenced = sorted(_global_names(fn.__code__) & fn.__globals__.keys())
        return (
            "function", fn.__module__, fn.__qualname__, code_fingerprint(fn.__code__),
            d(fn.__defaults__), d(fn.__kwdefaults__), closure,
            tuple((name, self._global(fn.__globals__[name], depth)) for name in referenced),
        )

    def _global(self, value: Any, depth: int) -> Any:
        # A global read by the backend is part of its behaviour, unless it is
        # mutable state: then the backend could change under the same code.
        if isinstance(value, (dict, list, set)):
            raise Unfingerprintable("reads a mutable global")
        return self.describe(value, depth)

    @staticmethod
    def _class_code(cls: type) -> tuple:
        return tuple(
            (name, code_fingerprint(member.__code__))
            for name, member in sorted(vars(cls).items())
            if isinstance(member, types.FunctionType)
        )


def _has_slot_state(cls: type) -> bool:
    return any(slot not in ("__dict__", "__weakref__")
               for c in cls.__mro__ for slot in c.__dict__.get("__slots__", ()))


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _readable(tree: Any) -> str:
    """A short human description: names and options, without code hashes."""
    if isinstance(tree, str):
        return tree
    kind = tree[0] if isinstance(tree, tuple) and tree and isinstance(tree[0], str) else None
    if kind == "named":
        return tree[1]
    if kind == "function":
        return f"{tree[1]}.{tree[2]}"
    if kind == "method":
        return f"{_readable(tree[1])}.{_readable(tree[2]).rsplit('.', 1)[-1]}"
    if kind == "partial":
        return f"partial({_readable(tree[1])})"
    if kind == "class":
        return tree[1].rsplit(".", 1)[-1]
    if kind == "object":
        cls, (_, items) = _readable(tree[1]), tree[2]
        shown = ", ".join(f"{_readable(k)}={_readable(v)}" for k, v in items
                          if not (isinstance(k, str) and k.startswith("_")))
        return f"{cls}({shown})"
    if kind == "dict":
        return "{" + ", ".join(f"{_readable(k)}: {_readable(v)}" for k, v in tree[1]) + "}"
    if kind in ("tuple", "list"):
        return "[" + ", ".join(_readable(v) for v in tree[1]) + "]"
    if kind == "float":
        return tree[1]
    if kind in ("module", "builtin", "torch", "enum"):
        return str(tree[-1] if kind != "builtin" else tree[2])
    return repr(tree)
