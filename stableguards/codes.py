"""Code objects and names, told the same way in every process.

* ``code_digest``: what a code object does (bytecode, names, constants, nested
  code), hashed without ``hash()`` or ``marshal`` (both differ per process);
* ``code_path`` / ``code_at``: a function's code found again by its import
  name, through the decorators that wrap it and the enclosing function's
  constants;
* ``descriptor_source``: a property getter's code, found the way torch's
  package looks code up;
* ``qualified``, ``resolve``: an object's import name, and the object of a name;
* ``frame_label``: how explanations name a frame.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import inspect
import os
import sys
import types
from typing import Any

from stableguards.components import stable_repr


@functools.lru_cache(maxsize=16384)  # code objects compare by value: equal code, equal digest
def code_digest(code: types.CodeType) -> str:
    """A hash of what a code object does, the same in every process.

    ``marshal.dumps`` is not: it writes back-references depending on reference
    counts; nor is ``hash(code)`` on Python 3.11 (it mixes in ``hash(None)``, an
    address).  So the qualified name, bytecode, names and constants are hashed
    directly, nested code objects (lambdas, comprehensions) included.
    """
    digest = hashlib.sha256()
    _feed_code(digest, code)
    return digest.hexdigest()


def _feed_code(digest: Any, code: types.CodeType) -> None:
    digest.update(getattr(code, "co_qualname", code.co_name).encode())
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


# (module, qualname, wrappers, co_consts indices, digest): where ``code_at`` finds a code object again.
CodePath = tuple[str, str, int, tuple[int, ...], str]

# How many decorators deep (``__wrapped__``) a function's code is looked for under its name.
_MAX_WRAPPERS = 8


def code_path(code: types.CodeType) -> CodePath | None:
    """Where a function's code lives: ``(module, qualname, wrappers, co_consts indices, digest)``.

    The function of that qualname (for a local function, the outermost
    enclosing one) is found by name in its module; ``wrappers`` times
    ``__wrapped__`` lead through its decorators (``functools.wraps``) to the
    function whose code is this one or, for a local function, holds it among
    its constants (every function a ``def`` inside another creates shares that
    one code object).  Code made by ``exec`` (a dataclass's ``__init__``) has no
    module of its own: it is found through the functions that run it, by their
    ``__module__`` and ``__qualname__``.  That path leads a restarted process to
    the very code object its live functions run, so an identity check on
    ``fn.__code__`` means there what it meant here.  None when no such path leads
    back to this exact object: the caller keeps the identity check that can never
    pass across processes.
    """
    qualname = getattr(code, "co_qualname", "")
    outer = qualname[: qualname.index(".<locals>.")] if ".<locals>." in qualname else qualname
    module = inspect.getmodule(code)
    if outer and module is not None and sys.modules.get(module.__name__) is module:
        return _path_from(module.__name__, outer, code) or _path_by_attribute(module.__name__, outer, code)
    if not code.co_filename.startswith("<"):
        return None
    runners = (f for f in gc.get_referrers(code) if isinstance(f, types.FunctionType) and f.__code__ is code)
    for fn in runners:
        if isinstance(fn.__module__, str) and "<locals>" not in fn.__qualname__:
            path = _path_from(fn.__module__, fn.__qualname__, code)
            if path is not None:
                return path
    return None


def _path_from(module: str, qualname: str, code: types.CodeType) -> CodePath | None:
    try:
        fn = _unwrapped(resolve(module, qualname, unwrapped=True))
    except (AttributeError, KeyError):
        return None
    for wrappers in range(_MAX_WRAPPERS + 1):
        inner = getattr(fn, "__code__", None)
        if isinstance(inner, types.CodeType):
            indices = () if inner is code else _find_const(inner, code)
            if indices is not None:
                return module, qualname, wrappers, indices, code_digest(code)
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return None
    return None


def _path_by_attribute(module: str, outer: str, code: types.CodeType) -> CodePath | None:
    """The path of code whose qualname names no attribute: a lambda bound to a module global or
    a class attribute (``scale = lambda t: ...``, qualname ``<lambda>``), found by the name
    that holds it in its owner's namespace.  ``code_at`` checks the digest again in the
    restarted process, so a name that holds other code there is a miss, not a stand-in."""
    owner_name, _, _ = outer.rpartition(".")
    try:
        owner = resolve(module, owner_name) if owner_name else sys.modules[module]
    except (AttributeError, KeyError):
        return None
    for name, value in sorted(vars(owner).items()):  # sorted: the first name is the same in every process
        fn = _unwrapped(value)
        if isinstance(fn, types.FunctionType) and getattr(fn.__code__, "co_qualname", None) == outer:
            path = _path_from(module, f"{owner_name}.{name}" if owner_name else name, code)
            if path is not None:
                return path
    return None


def code_at(module: str, qualname: str, wrappers: int, indices: tuple[int, ...], digest: str) -> types.CodeType:
    """The code object ``code_path`` named, in this process.

    Raises RuntimeError (what torch's loader falls back on) when it is gone or
    its code differs from the saved one: a stand-in object would let a later
    object reuse its id and pass an identity check meant for another.  A module
    not imported yet is not imported here.
    """
    try:
        fn = _unwrapped(resolve(module, qualname, unwrapped=True))
        for _ in range(wrappers):
            fn = fn.__wrapped__
        code = fn.__code__
        for index in indices:
            code = code.co_consts[index]
    except (AttributeError, IndexError, KeyError, TypeError) as error:
        raise RuntimeError(f"the code of {module}.{qualname} is not where it was: {error!r}") from error
    if not isinstance(code, types.CodeType) or code_digest(code) != digest:
        raise RuntimeError(f"the code of {module}.{qualname} changed since it was saved")
    return code


def descriptor_source(code: types.CodeType) -> tuple[str, str] | None:
    """Where torch's package lookup (attribute access along a name, then a path) finds ``code``
    when it is a property's getter, setter or deleter, or a ``functools.cached_property``'s
    function: the descriptor's qualname, and ``fget.__code__`` (or the like) from it.  None
    for any other code."""
    module = inspect.getmodule(code)
    owner_name, _, name = code.co_qualname.rpartition(".")
    if module is None or not owner_name:
        return None
    try:
        owner = resolve(module.__name__, owner_name)
    except (KeyError, AttributeError):
        return None
    descriptor = vars(owner).get(name) if isinstance(owner, type) else None
    if not isinstance(descriptor, (property, functools.cached_property)):
        return None
    for attr in ("fget", "fset", "fdel", "func"):
        fn = getattr(descriptor, attr, None)
        if isinstance(fn, types.FunctionType) and fn.__code__ is code:
            return f"{owner_name}.{name}", f"{attr}.__code__"
    return None


def resolve(module: str, qualname: str, *, unwrapped: bool = False) -> Any:
    """The object named ``module.qualname`` in this process, as attribute access gives it, or
    with ``unwrapped`` as a class holds it (a staticmethod or classmethod itself).  Raises
    KeyError or AttributeError; a module not imported yet is not imported here."""
    obj: Any = sys.modules[module]
    for name in qualname.split("."):
        in_class = unwrapped and isinstance(obj, type) and name in vars(obj)
        obj = vars(obj)[name] if in_class else getattr(obj, name)
    return obj


def _unwrapped(obj: Any) -> Any:
    """The function a staticmethod or classmethod holds."""
    return getattr(obj, "__func__", obj)


def _find_const(code: types.CodeType, target: types.CodeType) -> tuple[int, ...] | None:
    for index, const in enumerate(code.co_consts):
        if const is target:
            return (index,)
        if isinstance(const, types.CodeType):
            inner = _find_const(const, target)
            if inner is not None:
                return (index, *inner)
    return None


def qualified(obj: Any) -> str:
    """``module.qualname`` of a class or function; of its type for anything else."""
    if not hasattr(obj, "__qualname__"):
        obj = type(obj)
    return f"{getattr(obj, '__module__', '?')}.{obj.__qualname__}"


def frame_label(code: types.CodeType) -> str:
    """``fn (file.py:12)``: how explanations name a frame."""
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
