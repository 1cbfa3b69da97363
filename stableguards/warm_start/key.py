"""Which saved Dynamo entry a restarted process may install: the entry's identity.

torch can save a compiled frame (its guards, transformed bytecode and graph
artifacts) and install it in a new process without tracing again
(``torch._dynamo.package``).  It finds the entry by ``sha256(qualname + first
line)`` alone, so ``pkg_a.mod.f`` and ``pkg_b.mod.f`` at the same line share one,
every ``model.compile()`` shares ``Module._call_impl``'s, and neither the
backend, its options nor the compiler configuration take part: a warm process
could run another backend's code.

Here the entry's identity is an ordered list of named components, hashed into
the key the entry is stored under (as JAX builds its compilation cache key):
torch's own key first, then what it leaves out.  Each component is kept beside
the entry, so a miss can say which component changed.  Everything here is
plain Python; ``stableguards.hooks.precompile`` feeds it torch's objects.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
import uuid as uuid_module
import sys
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EntryKey:
    """What a saved entry must match: named components, in order, and their digest."""

    components: tuple[tuple[str, str], ...]

    @property
    def digest(self) -> str:
        text = "\n".join(f"{name}={value}" for name, value in self.components)
        return hashlib.sha256(text.encode()).hexdigest()

    def differences(self, other: EntryKey) -> list[str]:
        """The components that tell ``self`` from ``other``, in order."""
        mine, theirs = dict(self.components), dict(other.components)
        names = [n for n, _ in self.components] + [n for n, _ in other.components if n not in mine]
        return [f"{n}: {_short(mine.get(n, '(absent)'))} vs {_short(theirs.get(n, '(absent)'))}"
                for n in names if mine.get(n) != theirs.get(n)]

    def as_json(self) -> list[list[str]]:
        return [list(c) for c in self.components]

    @classmethod
    def from_json(cls, data: Iterable[Iterable[str]]) -> EntryKey:
        return cls(tuple((str(name), str(value)) for name, value in data))


def entry_key(*, torch_key: str, fn: Any, backend: str, options: Mapping[str, Any],
              configs: Mapping[str, Mapping[str, Any]]) -> EntryKey:
    """The identity of ``fn``'s entry.

    ``fn`` is what torch.compile was given, after unwrapping: a function or a
    bound method, whose receiver's class names the code it shares
    (``Module._call_impl``).  ``backend`` is the backend's stable fingerprint;
    ``options`` the other arguments of ``torch.compile`` that change what is
    traced (``dynamic``); ``configs`` the compiler configurations by name.
    """
    function = getattr(fn, "__func__", fn)
    code = function.__code__
    receiver = getattr(fn, "__self__", None)
    components = [
        ("torch_key", torch_key),
        ("module", str(getattr(function, "__module__", None))),
        ("qualname", function.__qualname__),
        ("file", code.co_filename),
        ("code", code_digest(code)),
        ("receiver", _qualified(type(receiver)) if receiver is not None else "-"),
        ("backend", backend),
    ]
    components += [(f"option.{name}", stable_repr(value)) for name, value in sorted(options.items())]
    components += [(f"config.{name}", config_digest(values)) for name, values in configs.items()]
    return EntryKey(tuple(components))


@functools.lru_cache(maxsize=16384)  # code objects compare by value: equal code, equal digest
def code_digest(code: types.CodeType) -> str:
    """A hash of what a code object does, the same in every process.

    ``marshal.dumps`` is not: it writes back-references depending on reference
    counts.  So the bytecode, names and constants are hashed directly, nested
    code objects (lambdas, comprehensions) included.
    """
    digest = hashlib.sha256()
    _feed_code(digest, code)
    return digest.hexdigest()


def _feed_code(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(getattr(code, "co_exceptiontable", b""))
    for names in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        digest.update(repr(names).encode())
    digest.update(repr((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_nlocals,
                        code.co_flags)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(digest, const)
        else:
            digest.update(stable_repr(const).encode())


def code_path(code: types.CodeType) -> tuple[str, str, tuple[int, ...], str] | None:
    """Where a local function's code lives: ``(module, outer qualname, co_consts indices, digest)``.

    Every function a ``def`` inside another function creates shares one code
    object, a constant of the enclosing function's code.  When the outermost
    enclosing function is found by name in its module, that path leads a
    restarted process to the very code object its live functions run, so an
    identity check on ``fn.__code__`` means there what it meant here.  None
    when the path does not lead back to this exact object (a decorated outer
    function, ``exec``'d or ``code.replace``'d code): the caller keeps the
    identity check that can never pass across processes.
    """
    qualname = getattr(code, "co_qualname", "")
    if ".<locals>." not in qualname:
        return None
    outer = qualname[: qualname.index(".<locals>.")]
    module = inspect.getmodule(code)
    if module is None or sys.modules.get(module.__name__) is not module:
        return None
    try:
        indices = _find_const(_outer_code(module.__name__, outer), code)
    except (AttributeError, KeyError, TypeError):
        return None
    return None if indices is None else (module.__name__, outer, indices, code_digest(code))


def code_at(module: str, outer: str, indices: tuple[int, ...], digest: str) -> types.CodeType:
    """The code object ``code_path`` named, in this process.

    Raises RuntimeError (what torch's loader falls back on) when it is gone or
    its code differs from the saved one: a stand-in object would let a later
    object reuse its id and pass an identity check meant for another.  A module
    not imported yet is not imported here.
    """
    try:
        code = _outer_code(module, outer)
        for index in indices:
            code = code.co_consts[index]
    except (AttributeError, IndexError, KeyError, TypeError) as error:
        raise RuntimeError(f"the code of {module}.{outer}.<locals> is not where it was: {error!r}") from error
    if not isinstance(code, types.CodeType) or code_digest(code) != digest:
        raise RuntimeError(f"the code of a local function in {module}.{outer} changed since it was saved")
    return code


def _outer_code(module: str, qualname: str) -> types.CodeType:
    obj: Any = sys.modules[module]
    for name in qualname.split("."):
        # A class's own __dict__ first: a staticmethod or classmethod stays unwrapped.
        obj = vars(obj)[name] if isinstance(obj, type) and name in vars(obj) else getattr(obj, name)
    return getattr(obj, "__func__", obj).__code__


def _find_const(code: types.CodeType, target: types.CodeType) -> tuple[int, ...] | None:
    for index, const in enumerate(code.co_consts):
        if const is target:
            return (index,)
        if isinstance(const, types.CodeType):
            inner = _find_const(const, target)
            if inner is not None:
                return (index, *inner)
    return None


def config_digest(values: Mapping[str, Any]) -> str:
    """A configuration's settings, hashed in a way that does not depend on the process.

    Settings in ``NOT_CODE`` are left out: they name where this process writes
    debug output or how many workers compile, which depend on the working
    directory and the machine and not on what is compiled (torch's own FX-graph
    key leaves the inductor ones out for the same reason).  Everything else is
    kept: a setting not known to be harmless to ignore costs a miss, never a
    wrong hit.
    """
    kept = {name: value for name, value in values.items() if not name.startswith(NOT_CODE)}
    text = "\n".join(f"{name}={stable_repr(value)}" for name, value in sorted(kept.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# Setting names (prefixes) that never change compiled code: Dynamo's debug directory (the
# working directory's), inductor's trace output, CUTLASS checkout paths, and its compile
# workers (their count follows the machine's cores).
NOT_CODE = ("debug_dir_root", "trace.", "cuda.cutlass_dir", "cutlass.cutlass_dir", "xpu.cutlass_dir",
            "worker_start_method", "compile_threads", "compile_worker_")


def stable_repr(value: Any) -> str:
    """``repr`` with sets sorted, so string hashing's per-process seed does not show.

    An object with a ``uuid()`` (inductor's ``CustomGraphPass``) is written by
    it, as torch's own cache keys do.  An object whose ``repr`` carries its
    address is written as one that only this process knows: the same here
    (torch's configuration copies, new on every read, keep one key), never
    found in another process, which costs a compile and is never wrong.
    """
    uuid = getattr(value, "uuid", None)
    if callable(uuid) and not isinstance(value, type):
        try:
            written = uuid()
        except Exception:  # noqa: BLE001 - a uuid() that fails: written as any other object
            written = None
        if written is not None:
            return f"{type(value).__qualname__}(uuid={written!r})"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({sorted(stable_repr(v) for v in value)})"
    if isinstance(value, dict):
        items = sorted((stable_repr(k), stable_repr(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(stable_repr(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    written = repr(value)
    return _ADDRESS.sub(f"at an address of process {_PROCESS}", written) if _ADDRESS.search(written) else written


# Object reprs with an address ("<X object at 0x7f...>"), and this process's own token for them.
_ADDRESS = re.compile(r"at 0x[0-9a-fA-F]+")
_PROCESS = uuid_module.uuid4().hex


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _short(value: str) -> str:
    return value if len(value) <= 80 else value[:77] + "..."
