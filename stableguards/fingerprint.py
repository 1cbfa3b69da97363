"""BACKEND_MATCH: which compiled code may be served to which backend.

torch matches a cache entry to the calling backend in C++: the same object, or
the same type and ``==``.  A loose ``__eq__`` then serves one configuration's
code to another, a backend rebuilt per ``torch.compile`` call never matches,
and every entry keeps its backend alive.

Here each backend gets a fingerprint: an ordered list of named components, in
the style of JAX's ``cache_key.py``, so that two backends that differ can say
which component differs.  Two backends share compiled code only when their
fingerprints are equal, and the rules that make two fingerprints equal are
exactly the ones we can prove sound:

1. **A registered backend, by name** (``"eager"``, ``"aot_eager"``).  A name
   in torch's registry resolves to one function object for the life of the
   process, so equal names mean the same compiler.
2. **torch's own wrappers, by their parts** (``torch.compile``'s inductor and
   generic wrappers, ``aot_autograd(...)``), recognised by exact type: torch
   wrote their ``__call__``, which does nothing but call their parts (the
   registered compiler, the options, ``fw_compiler``, ...).  Every instance
   attribute is a part, so an attribute a later torch adds is covered too, and
   the wrappers are equivalent when every part is: equal plain values, or the
   same object by the rules here.  A subclass may override ``__call__`` and is
   not recognised.
3. **An explicit key.**  A backend that carries a truthy, plain (str, bytes,
   int, bool, tuples of them) ``_torchdynamo_cache_key`` declares that all
   backends of its class with that key compile alike: upstream's opt-in
   (pytorch PRs #195355, #196120), compared with its class so that two classes
   cannot claim each other's code.  A falsy key (``None``, ``""``, ``0``) is no
   opt-in, as upstream's review insists; nor is an unhashable or non-plain one
   (an object's own ``__eq__`` would decide, which is what this module avoids).
4. **Everything else, by identity.**  A user's function, closure, partial,
   stateful object or object with a loose ``__eq__`` shares code only with
   itself: what it does can depend on anything it reaches, so no description
   short of running it proves two of them alike.

Identity is a per-process token handed out once per object and never reused
(``IdentityTable``), not ``id()``, which a new object can take over once the
old one dies, and never the object's own ``__eq__``/``__hash__``.  A
fingerprint with an identity component is ``stable=False``: it means something
only in this process.

Equal fingerprints are interned to one ``BackendKey`` object per process, and
that key is what the cache entries hold: matching stays a pointer comparison
in C++ (no Python call on the hot path), and the entries do not keep the
backend itself alive.
"""

from __future__ import annotations

import itertools
import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from stableguards.codes import qualified
from stableguards.components import Components
from stableguards.identity_table import IdentityTable

# The attribute through which a backend opts into sharing (rule 3).
CACHE_KEY_ATTR = "_torchdynamo_cache_key"
_PLAIN_LEAVES = (type(None), bool, int, float, str, bytes)
_KEY_LEAVES = (bool, int, str, bytes)  # no floats: nan != nan
# Default reprs embed an address ("<Foo object at 0x7f...>"): torch.compile names
# a backend without __name__ by str(backend) (_TorchCompileWrapper.compiler_name),
# a label for logs, while the object itself is another part, described by the
# rules.  Without this, two backends with equal explicit keys would never share.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MAX_COMPONENTS = 2_000
_MAX_DEPTH = 12  # containers nested deeper are matched by identity
_CONTAINER = re.compile(r"(dict|list|tuple) of \d+")

@dataclass(frozen=True)
class BackendFingerprint:
    """What identifies a backend configuration: named components, in order.

    Its digest is the same in every process unless ``stable`` is False (an
    identity component, see rule 4).
    """

    components: Components

    @property
    def digest(self) -> str:
        return self.components.digest

    @property
    def stable(self) -> bool:
        return not any(name.endswith("identity") for name, _ in self.components.items)

    @property
    def description(self) -> str:
        """The components a reader needs: names, identities and options that are set."""
        shown = []
        for name, value in self.components.items:
            leaf = name.rsplit(".", 1)[-1]
            if _is_label(name, value) or value == "None":
                continue
            if leaf == "wrapper":
                shown.append(value.rsplit(".", 1)[-1])
            else:
                shown.append(value if leaf in ("backend", "identity") else f"{name}={value}")
        return " ".join(shown)

    def differences(self, other: BackendFingerprint) -> list[str]:
        """The components that tell ``self`` from ``other``, in order; labels and
        container sizes only where nothing else differs."""
        return self.components.differences(other.components, minor=_is_label)

    def __str__(self) -> str:
        text = self.description
        return f"{text if len(text) <= 160 else text[:157] + '...'} #{self.digest[:12]}"


class Fingerprinter:
    """Builds fingerprints under the four rules.

    What torch's internals look like is not known here: the caller says which
    objects are registered backends (``registered_name``), which are torch's
    own wrappers (``is_torch_wrapper``) and which torch objects have a name
    that identifies them (``torch_name``: ops, dtypes).
    """

    def __init__(self, registered_name: Callable[[object], str | None] = lambda _: None,
                 is_torch_wrapper: Callable[[object], bool] = lambda _: False,
                 torch_name: Callable[[object], str | None] = lambda _: None) -> None:
        self.registered_name = registered_name
        self.is_torch_wrapper = is_torch_wrapper
        self.torch_name = torch_name
        self._tokens: IdentityTable[int] = IdentityTable()
        self._next_token = itertools.count(1)
        # torch's wrappers described when first seen: aot_autograd rewrites its
        # own options on first use, and must keep the identity it had.
        self._wrappers: IdentityTable[tuple[tuple[str, str], ...]] = IdentityTable()
        self._describing: set[int] = set()

    def fingerprint(self, backend: object) -> BackendFingerprint:
        return BackendFingerprint(Components(tuple(self._components(backend, ""))))

    def identity(self, obj: object) -> str:
        """``module.Class#N``: this object, and no other, for the life of the process."""
        cls = type(obj)
        name = getattr(obj, "__qualname__", None) if callable(obj) and hasattr(obj, "__code__") else None
        label = f"{getattr(obj, '__module__', cls.__module__)}.{name}" if name else qualified(cls)
        return f"{label}#{self._tokens.get(obj, lambda: next(self._next_token))}"

    def _components(self, obj: object, prefix: str) -> Iterator[tuple[str, str]]:
        name = self.registered_name(obj)
        if name is not None:
            yield prefix + "backend", name
        elif self.is_torch_wrapper(obj):
            for part, value in self._wrappers.get(obj, lambda: tuple(self._wrapper(obj))):
                yield prefix + part, value
        elif (key := _explicit_key(obj)) is not None:
            yield prefix + "class", qualified(type(obj))
            yield prefix + "cache_key", key
        else:
            yield prefix + "identity", self.identity(obj)

    def _wrapper(self, wrapper: object) -> Iterator[tuple[str, str]]:
        if id(wrapper) in self._describing:  # a wrapper that contains itself
            yield "identity", self.identity(wrapper)
            return
        self._describing.add(id(wrapper))
        try:
            yield "wrapper", qualified(type(wrapper))
            yield from self._parts(sorted(vars(wrapper).items()), 0)
        finally:
            self._describing.discard(id(wrapper))

    def _parts(self, items: list[tuple[str, Any]], depth: int) -> Iterator[tuple[str, str]]:
        """Each (label, value): plain values as text, containers item by item, objects by the rules."""
        for label, value in items:
            plain = self._plain(value)
            if plain is not None:
                yield label, plain
                continue
            if isinstance(value, dict) and depth < _MAX_DEPTH and len(value) < _MAX_COMPONENTS:
                keys = [(self._plain(k), v) for k, v in value.items()]
                if all(k is not None for k, _ in keys):
                    yield label, f"dict of {len(keys)}"
                    yield from self._parts(sorted(((f"{label}[{k}]", v) for k, v in keys),
                                                  key=lambda item: item[0]), depth + 1)
                    continue
            elif isinstance(value, (list, tuple)) and depth < _MAX_DEPTH and len(value) < _MAX_COMPONENTS:
                yield label, f"{type(value).__name__} of {len(value)}"
                yield from self._parts([(f"{label}[{i}]", v) for i, v in enumerate(value)], depth + 1)
                continue
            yield from self._components(value, label + ".")

    def _plain(self, value: Any) -> str | None:
        """A canonical text for plain data (type included: 1, 1.0 and True differ), else None."""
        if type(value) is str:
            return repr(_ADDRESS.sub(" at 0x?", value))
        if type(value) in _PLAIN_LEAVES:  # exact types: their reprs tell 1, 1.0, True, '1' apart
            return repr(value)
        name = self.torch_name(value)
        return None if name is None else f"torch:{name}"


def _is_label(name: str, value: str) -> bool:
    """Components that follow from others: names for logs and container sizes."""
    return name.rsplit(".", 1)[-1] in ("compiler_name", "__name__") or bool(_CONTAINER.fullmatch(value))


def _explicit_key(obj: object) -> str | None:
    """The canonical text of ``obj``'s opt-in key (rule 3), or None if it has none that counts."""
    try:
        key = getattr(obj, CACHE_KEY_ATTR, None)
        if not key:
            return None
        hash(key)
    except Exception:  # noqa: BLE001 - a key that cannot be read or hashed is no opt-in
        return None
    return _key_text(key)


def _key_text(key: Any) -> str | None:
    if type(key) in _KEY_LEAVES:
        return repr(key)
    if type(key) is tuple:
        parts = [_key_text(k) for k in key]
        return None if None in parts else "(" + ", ".join(parts) + ")"  # type: ignore[arg-type]
    return None


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
