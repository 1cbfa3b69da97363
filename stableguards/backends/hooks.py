"""BACKEND_MATCH: a per-backend cache, keyed by stableguards' backend fingerprints.

torch.compile hands Dynamo a backend; ``get_compiler_fn`` wraps it for
calling.  We put a ``_KeyedBackend`` in between whose
``_torchdynamo_orig_backend`` is the interned key of the backend's
fingerprint (``stableguards.fingerprint``).  The C++ cache lookup follows
that attribute chain to its end, so cache entries store and compare the key:
a pointer comparison for equivalent backends, never a match for others, and
no strong reference to the backend itself.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

from stableguards.backends import messages
from stableguards.events import EVENTS
from stableguards.fingerprint import BackendKey, key_for
from stableguards.hooks import seams
from stableguards.hooks.core import Hook, registered_name
from stableguards.hooks.entries import release_entries
from stableguards.hooks.fingerprints import backend_fingerprint
from stableguards.hooks.seams import fills
from stableguards.hooks.state import STATE

_CONVERT_FRAME = "torch._dynamo.convert_frame"


class _DynamoBackendKey(BackendKey):
    """A BackendKey as Dynamo expects the end of the backend chain to look.

    ``compiler_name`` is the backend's own (``"eager"``, ``"inductor"``), as on
    torch's wrappers; ``registered`` is what torch says of the backend itself
    (Dynamo clears compile-time weakrefs after compiling for registered ones).
    Dynamo calls ``_KeyedBackend``; torch's ahead-of-time compile
    (``aot_compile``) calls the end of the chain, this key: it calls the last
    backend keyed to it that is alive, which compiles as any of them would (they
    are equivalent: that is what the key says).  The reference is weak, as the
    key must not keep a backend alive.
    """

    __slots__ = ("compiler_name", "registered", "backend")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        backend = self.backend() if hasattr(self, "backend") else None
        if backend is None:
            raise RuntimeError(f"every backend of configuration {self.fingerprint} is gone")
        return backend(*args, **kwargs)

    def reset(self) -> None:
        """torch._dynamo.reset() resets cached backends; the backends themselves reset elsewhere."""


class _KeyedBackend:
    """The user's backend, as Dynamo calls it, with its key where Dynamo looks for identity."""

    def __init__(self, backend: Any, key: _DynamoBackendKey) -> None:
        self._backend = backend
        self._torchdynamo_orig_backend = key
        self.compiler_name = getattr(backend, "compiler_name", None) or key.compiler_name
        # WrapBackendDebug copies this object's __dict__, so these must be instance attributes.
        for name in ("backend_ctx_ctor", "get_compiler_config"):
            if hasattr(backend, name):
                setattr(self, name, getattr(backend, name))

    def __getattr__(self, name: str) -> Any:
        # Whatever else torch asks of the backend (``_dynamo_backend_init`` from 2.15 on).
        backend = self.__dict__.get("_backend")
        if backend is None:
            raise AttributeError(name)
        return getattr(backend, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._backend(*args, **kwargs)

    def reset(self) -> None:
        reset = getattr(self._backend, "reset", None)
        if callable(reset):
            reset()


def _get_compiler_fn(call: Any, compiler_fn: Any) -> Any:
    """The backend Dynamo calls, behind the interned key of its fingerprint."""
    STATE.release_pending()
    if isinstance(compiler_fn, _KeyedBackend):
        return call(compiler_fn)
    backend = compiler_fn
    if isinstance(compiler_fn, str):
        from torch._dynamo.backends.registry import lookup_backend

        try:
            backend = lookup_backend(compiler_fn)
        except Exception:  # noqa: BLE001 - an unknown name: torch says so in its own words
            return call(compiler_fn)
    keyed = _keyed(backend)
    try:
        return call(keyed)
    except Exception as error:  # noqa: BLE001 - torch refused the wrapper: it gets the backend itself
        EVENTS.fell_back("backend match (torch refused the keyed backend)", error)
        return call.fn(compiler_fn)


def _keyed(backend: Any) -> _KeyedBackend:
    from torch._dynamo.backends import registry

    fp = backend_fingerprint(backend)
    key = key_for(fp, _DynamoBackendKey)
    if not hasattr(key, "compiler_name"):  # equivalent backends, equal names: set once
        key.compiler_name = (getattr(backend, "compiler_name", None)
                             or registered_name(backend) or fp.description)
        key.registered = registry._is_registered_backend(backend)
    key.watch(_user_backend(backend), _release_entries)
    key.backend = _reference(backend)
    return _KeyedBackend(backend, key)  # type: ignore[arg-type]


def _reference(obj: Any) -> Callable[[], Any]:
    """A weak reference where one can be taken (a registered function or a string lives as
    long as the process anyway)."""
    try:
        return weakref.WeakMethod(obj) if isinstance(obj, types.MethodType) else weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _user_backend(backend: Any) -> Any:
    """The object whose life decides how long compiled code is kept, or None for good.

    torch.compile wraps what the user passed (a name, a callable) in a wrapper
    made per call; the user's own object is its ``compiler_fn``.  Registered
    backends and inductor live as long as the process.
    """
    inner = getattr(backend, "compiler_fn", backend)
    if getattr(backend, "compiler_name", None) == "inductor" and not hasattr(backend, "compiler_fn"):
        return None
    return None if registered_name(inner) is not None else inner


def _release_entries(key: BackendKey) -> None:
    """A key's last backend died: release its cache entries (unless an equivalent one came back)."""

    def release() -> None:
        if not key.alive:
            released = release_entries(lambda e: e.backend is key, "backend was collected")
            messages.released(str(key.fingerprint), released)

    STATE.release_soon(release)


@fills("convert_frame.start", "backends")
def note_switch(compile: seams.Compile) -> None:
    """A frame starts compiling (``hooks.seams``): say when it switched backends."""
    import torch._C._dynamo.eval_frame as c_eval_frame

    key = compile.backend_key
    if key is None:
        return
    others = {e.backend for e in c_eval_frame._debug_get_cache_entry_list(compile.code)
              if e.code is not None and e.backend is not None}
    if others and key not in others:
        messages.switched(compile.label, key.fingerprint,
                          [o.fingerprint if isinstance(o, BackendKey) else type(o).__name__ for o in others])


@fills("cache_size.count", "backends")
def own_entries(cache_entries: list, compile: seams.Compile | None) -> list:
    """Which entries count towards the recompile limit (``hooks.seams``): the live ones of the
    backend being compiled for."""
    key = compile.backend_key if compile is not None else None
    if key is None:
        return cache_entries
    return [e for e in cache_entries if e.backend is key and e.code is not None]


def _is_registered_backend(call: Any, compiler_fn: Any) -> bool:
    """torch asks this of the end of the backend chain: for a key, answer for its backend."""
    if isinstance(compiler_fn, _DynamoBackendKey):
        return compiler_fn.registered
    return call(compiler_fn)


HOOKS = [
    Hook("torch._dynamo.eval_frame", "get_compiler_fn", "backends", _get_compiler_fn,
         params=("compiler_fn",)),
    # convert_frame imported it by name: patch its copy.
    Hook(_CONVERT_FRAME, "_is_registered_backend", "backends", _is_registered_backend,
         params=("compiler_fn",)),
]
