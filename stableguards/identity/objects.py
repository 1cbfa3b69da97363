"""What an object is, told the same way in every process: the identity rule.

A compile that guarded an object by identity (``ID_MATCH`` on a module, a
class, a builtin; ``TYPE_MATCH``; a function's ``__code__``) proved "this is
that object", which says nothing in another process.  What it relied on is
what the object *is*: the code a function runs, with its defaults and what
its closure holds; the methods of a class, along its MRO; the name a module or
a builtin is imported under.  ``identity(obj)`` describes exactly that, so two
processes compute the same string only for objects a compile cannot tell
apart, and it returns None where no such description exists: the caller then
leaves the entry out rather than trust a name.

* constants (None, bools, numbers, strings, bytes) and containers of
  describable objects: by value (sets sorted, so the hash seed does not show);
  a bare ``object()`` (a sentinel) as itself: it has nothing but its identity,
  which code compares within one process;
* a module: its name, when ``sys.modules`` holds it under that name;
* a builtin function: where it is imported from, when that name leads back to
  it, and outside the interpreter's own modules and torch the version of its
  package (a C extension with none has no identity); a C method of a class
  (``dict.get``): that class and the method's name;
* a code object: ``code_digest`` (bytecode, names, constants, nested code);
* a Python function: its code, defaults, keyword defaults, the contents of
  its closure cells (recursively, by this same rule) and the module whose
  globals it reads.  The globals' values are not part of it: a compile that
  inlined the function guarded each global it read, on its own;
* a class: its import name (which must lead back to it) and, along its MRO,
  every function-like attribute (functions, static and class methods,
  properties) by this rule.  Dynamo trusts a class's methods while its
  identity holds, so a method patched in one process and not in the other
  changes the class's identity; a class a C extension made with pybind11
  (``ProcessGroup``), with its C methods named by its package's version; class attributes that are values are guarded
  by Dynamo when a compile reads them.  The class torch.fx makes for each graph
  module is not importable: its methods name it (its ``forward`` runs in the
  globals ``identity.fx_home`` names by their content); ``NoneType`` and the
  other singleton types, by name;
* an enum member: its class (with every member's name and value), its name, its
  value, the builtin data it mixes in and its attributes;
* a bound method, ``functools.partial`` and ``partialmethod``, a
  ``functools.cached_property`` (its function): their parts; a weak
  reference by what it refers to (code that holds one uses that object while
  it lives: an lr scheduler's wrapper of ``optimizer.step``);
* an optimizer (``torch.optim.Optimizer``): its class and its state (param
  groups with their hyperparameters, per-parameter state, hooks in order
  without their handles' ids), tensors in
  it by dtype, shape, strides, device and requires_grad.  Dynamo checks an
  optimizer by id and then reads what it uses of it through guarded sources
  (a tensor it reads is a graph input it guards, or a static address it
  checks by id, which has no identity here and leaves the entry out), so the
  state says which optimizer it is to a compile, and its tensors' values are
  data.  Another process cannot check an id: see ``by_state``;
* a config entry's ``ContextVar`` and a ``ProcessGroup``: ``identity.distributed``;
* a few torch value types whose ``repr`` is their whole value (dtypes,
  devices, operators by qualified name), told apart by type name so that this
  module needs no torch.

Everything here is plain Python; the hook layer hands it the objects.
"""

from __future__ import annotations

import builtins
import contextvars
import enum
import functools
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from stableguards.codes import code_digest, qualified
from stableguards.identity import fx_home
from stableguards.identity.distributed import DEVICE_MESH, PROCESS_GROUP, config_var, opaque_guarded, wrapper_class
from stableguards.identity.names import (BY_REPR, CHECKED, CONTEXT_DECORATORS, ENUM_BOOKKEEPING, ENUM_MIXINS,
                                         PLACEMENTS, SCALARS, SINGLETON_TYPES, TENSOR, TYPES_MODULE_NAMES, builtin,
                                         by_state, c_attribute, fx_graph_class, importable, is_a, label, module_copy,
                                         module_of_globals, package_version, parametrized, pybind_base, short_digest,
                                         tensor_identity, type_name)


class _Empty:
    """What an empty closure cell holds, here."""

    def __repr__(self) -> str:
        return "<empty cell>"


_EMPTY = _Empty()
_CONSTANTS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented), _Empty)
# C-level callables of classes: a method descriptor names its class and itself.
_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                types.GetSetDescriptorType, types.MemberDescriptorType, types.MethodWrapperType)



def identity(obj: Any) -> str | None:
    """A description of ``obj`` that is equal in two processes only for objects a compile
    cannot tell apart; None when ``obj`` has none."""
    return Identities()(obj)


class Identities:
    """``identity`` for many objects in a row (one guard tree): a class described once.

    Remembers what it is describing, so a cycle (a method's ``__class__`` cell
    holds its class) names the object instead of recursing.  Remembers a
    description, with its object (so an id is never reused while it is
    remembered), only where it is the one ``identity`` gives: a description
    depends on what was open around it where it names a cycle to it.  So, as
    in Tarjan's algorithm, the objects that reach one another (a strongly
    connected component: a class and its methods that call ``super()``) are
    told apart from the open ones around them; a description is remembered
    for the object the component was entered by, with the component, and
    served again while none of the component is open (where one is, the
    description made afresh would name it as a cycle).
    """

    def __init__(self, tensors: bool = False) -> None:
        self._tensors = tensors  # tensors by their metadata: only inside an optimizer's state
        self._open: dict[int, tuple[Any, int]] = {}  # id -> (object, how many were open before it)
        # id -> (object, description, its component: empty where it is alone)
        self._done: dict[int, tuple[Any, str | None, tuple[Any, ...]]] = {}
        self._entered: list[Any] = []  # objects entered whose component is not complete yet
        self._reached = 0  # the outermost open object a cycle named, within the current one
        self._instance_of: type | None = None  # a class made for one instance (_parametrized): that instance

    def __call__(self, obj: Any) -> str | None:
        return self.describe(obj)

    def describe(self, obj: Any) -> str | None:
        key = id(obj)
        done = self._done.get(key)
        if done is not None and done[0] is obj and (not done[2] or not any(id(o) in self._open for o in done[2])):
            return done[1]
        opened = self._open.get(key)
        if opened is not None:
            self._reached = min(self._reached, opened[1])
            return f"<cycle {label(opened[0])}>"
        depth = len(self._open)
        self._open[key] = (obj, depth)
        outer, self._reached = self._reached, depth
        mark = len(self._entered)
        self._entered.append(obj)
        try:
            described = self._describe(obj)
        finally:
            del self._open[key]
            reached, self._reached = self._reached, min(outer, self._reached)
        if reached >= depth:  # no cycle out of it: its component is what was entered since
            component = tuple(self._entered[mark:])
            del self._entered[mark:]
            self._done[key] = (obj, described, component if len(component) > 1 else ())
        return described

    def _all(self, values: Any) -> list[str] | None:
        described = [self.describe(v) for v in values]
        return None if any(d is None for d in described) else described  # type: ignore[return-value]

    def _describe(self, obj: Any) -> str | None:
        kind = type(obj)
        if kind is self._instance_of:
            return "<the instance the class was made for>"
        if kind in _CONSTANTS:
            return f"{kind.__name__}:{obj!r}"
        if kind is object:
            # A bare object() carries no state: a sentinel (a default argument `missing`),
            # which code only compares by identity, within one process.
            return "object()"
        if type_name(obj) in BY_REPR or (type_name(obj) in PLACEMENTS and not getattr(obj, "__dict__", None)):
            return f"{type_name(obj)}:{obj!r}"
        if kind in (tuple, list, frozenset, set):
            parts = self._all(obj)
            if parts is None:
                return None
            return f"{kind.__name__}({', '.join(sorted(parts) if kind in (set, frozenset) else parts)})"
        if kind is dict:
            items = self._all(obj.items())
            return None if items is None else "dict(" + ", ".join(sorted(items)) + ")"
        if isinstance(obj, types.ModuleType):
            if sys.modules.get(obj.__name__) is obj:
                return f"module:{obj.__name__}"
            return f"module-copy:{obj.__name__}:{obj.__file__}" if module_copy(obj) else None
        if isinstance(obj, types.CodeType):
            return f"code:{obj.co_qualname}:{code_digest(obj)}"
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, type):
            return self._class(obj)
        if isinstance(obj, types.BuiltinFunctionType):
            owner = getattr(obj, "__self__", None)
            if isinstance(owner, type):  # a C classmethod, bound to its class
                described = self.describe(owner)
                return None if described is None else f"builtin:{described}.{obj.__name__}"
            return builtin(obj)
        if isinstance(obj, _DESCRIPTORS):
            owner = self.describe(getattr(obj, "__objclass__", None))
            return None if owner is None else f"{kind.__name__}:{owner}.{obj.__name__}"
        if isinstance(obj, types.MethodType):
            parts = self._all((obj.__func__, obj.__self__))
            return None if parts is None else f"method:{parts[0]} of {parts[1]}"
        if isinstance(obj, (staticmethod, classmethod)):
            inner = self.describe(obj.__func__)
            return None if inner is None else f"{kind.__name__}({inner})"
        if isinstance(obj, property):
            parts = self._all((obj.fget, obj.fset, obj.fdel))
            return None if parts is None else f"property({', '.join(parts)})"
        if kind is weakref.ref:
            referent = obj()
            if referent is None:
                return "weakref(dead)"
            described = self.describe(referent)
            return None if described is None else f"weakref({described})"
        if isinstance(obj, (functools.partial, functools.partialmethod)):
            parts = self._all((obj.func, obj.args, obj.keywords))
            return None if parts is None else f"{kind.__name__}({', '.join(parts)})"
        if isinstance(obj, functools.cached_property):  # its function: what it computes, once per instance
            inner = self.describe(obj.func)
            return None if inner is None else f"cached_property({inner})"
        if isinstance(obj, enum.Enum):
            return self._enum_member(obj)
        if by_state(obj):
            return self._optimizer(obj)
        if self._tensors and is_a(kind, TENSOR):
            return tensor_identity(obj)
        if isinstance(obj, (tuple, list, frozenset, set, dict)) and not getattr(obj, "__dict__", None):
            # A container subclass with no instance state (torch.fx's immutable_dict): what its
            # class does, and its items.
            parts = self._all((kind, dict(obj) if isinstance(obj, dict) else tuple(obj)))
            return None if parts is None else f"{parts[0]}({parts[1]})"
        if any(qualified(k) in CONTEXT_DECORATORS for k in kind.__mro__):
            # torch.no_grad(), torch.compiler.disable and their kin used as a decorator: the closure
            # holds the instance (its clone makes the context of each call); what it does is its
            # class's code and its state.
            parts = self._all((kind, vars(obj)))
            return None if parts is None else f"instance:{parts[0]}:{parts[1]}"
        if isinstance(obj, contextvars.ContextVar):
            return config_var(obj, self.describe)
        if type_name(obj) in (PROCESS_GROUP, DEVICE_MESH):
            return opaque_guarded(obj)
        if qualified(kind) == "contextlib._GeneratorContextManager":
            # A @contextmanager function used as a decorator: each call makes its context again
            # from the function and its arguments (the generator it holds is spent state).
            parts = self._all((kind, obj.func, obj.args, obj.kwds))
            return None if parts is None else f"instance:{parts[0]}:{', '.join(parts[1:])}"
        return None

    def _function(self, fn: types.FunctionType) -> str | None:
        hook = getattr(fn, "__stableguards_hook__", None)
        if hook is not None:
            # One of stableguards' own wrappers (hooks.core): the function it wraps and the hook,
            # the same in every process where that hook is in place.  Its closure holds the
            # Hook record, which has no identity of its own.
            inner = self.describe(getattr(fn, "__wrapped__", None))
            return None if inner is None else f"hooked:{hook.module}.{hook.target}({hook.part}):{inner}"
        home = module_of_globals(fn.__globals__)
        if home is None and not fn.__code__.co_filename.startswith(fx_home.FILE_PREFIX):
            # Globals that are no module's: a namespace made for the function (namedtuple's
            # __new__, code exec'd into a fresh dict).  No name finds it in another process, so
            # it is described by what it holds, which is all the function's globals can read.
            # (torch.fx's graph code is given a home module of its own: identity.fx_home.)
            home = self._namespace(fn.__globals__)
        if home is None:
            return None
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # an empty cell
                cells.append(_EMPTY)
        parts = self._all((fn.__defaults__, fn.__kwdefaults__, tuple(cells)))
        if parts is None:
            return None
        details = f"{code_digest(fn.__code__)}:defaults={parts[0]}:kwdefaults={parts[1]}:closure={parts[2]}"
        return f"function:{home}.{fn.__qualname__}#{short_digest(details)}"

    def _namespace(self, scope: dict) -> str | None:
        held = {k: v for k, v in scope.items()
                if k != "__builtins__" or not (v is builtins or v is vars(builtins))}
        described = self.describe(held)
        if described is None:
            return None
        # exec() puts the interpreter's builtins there: that, by name (its code is the interpreter's).
        return f"namespace#{short_digest(described + (':builtins' if len(held) < len(scope) else ''))}"

    def contents(self, obj: Any) -> str | None:
        """An object with no identity of its own, by its class and what its ``__dict__`` holds
        (by these rules): for an object whose id check is bound on its entry's first call
        because the trace used its id only as a key, never to stand for one by name."""
        state = getattr(obj, "__dict__", None)
        if type(state) is not dict or getattr(type(obj), "__slots__", ()):
            return None  # state outside __dict__ (slots, a C type's fields) would go unsaid
        parts = self._all((type(obj), state))
        return None if parts is None else f"contents:{parts[0]}:{parts[1]}"

    def optimizer(self, optimizer: Any, guarded: Callable[[int, str], bool]) -> str | None:
        """An optimizer at a source whose guard tree checks some of its hyperparameters there:
        ``guarded(group, key)`` says whether it checks ``param_groups[group][key]``.  Those,
        when plain scalars, are left out: the tree checks each on every call (a value, or a
        graph input where the step reads it at run time), so a restart at another point of
        an lr schedule still finds the entry.  Anything else, as ``describe``."""
        return self._optimizer(optimizer, guarded)

    def _optimizer(self, optimizer: Any, guarded: Callable[[int, str], bool] | None = None) -> str | None:
        """Its class, and everything it holds, tensors by metadata.  Described apart (its own
        Identities): a tensor is described by metadata only here, never where a value of
        it could be what a function reads."""
        owner = self.describe(type(optimizer))
        if owner is None:
            return None
        inner = Identities(tensors=True)
        inner._open[id(optimizer)] = (optimizer, 0)  # a hook bound to it names it as a cycle
        # Hooks are kept by their handles' ids, a per-process counter: the hooks, in order.
        held = {name: list(value.values()) if name.endswith("_hooks") and isinstance(value, dict) else value
                for name, value in vars(optimizer).items()}
        groups = held.get("param_groups")
        if guarded is not None and isinstance(groups, list) and all(type(g) is dict for g in groups):
            held["param_groups"] = [{key: CHECKED if guarded(i, key) and type(value) in SCALARS else value
                                     for key, value in group.items()} for i, group in enumerate(groups)]
        described = inner.describe(held)
        return None if described is None else f"optimizer:{owner}#{short_digest(described)}"

    def _enum_member(self, member: enum.Enum) -> str | None:
        """An enum member: its class, its name and everything a compile can fold from it: its
        value (``x * Lvl.K`` folds an ``IntEnum``'s int, which Dynamo checks by id alone), the
        data of a builtin type it mixes in where that is not its value (a custom ``__new__``),
        and the attributes an ``__init__`` gave it."""
        owner = self.describe(type(member))
        if owner is None:
            return None
        data = tuple(convert(member) for base, convert in ENUM_MIXINS.items() if isinstance(member, base))
        attributes = {name: value for name, value in vars(member).items() if name not in ENUM_BOOKKEEPING}
        parts = self._all((member._value_, *data, *((attributes,) if attributes else ())))
        return None if parts is None else f"enum:{owner}.{member._name_}={':'.join(parts)}"

    def _class(self, cls: type) -> str | None:
        if cls in SINGLETON_TYPES:
            return f"class:{cls.__name__}"
        if cls in TYPES_MODULE_NAMES:
            return f"class:{TYPES_MODULE_NAMES[cls]}"
        if not importable(cls) and not fx_graph_class(cls):
            return self._parametrized(cls) if parametrized(cls) else wrapper_class(cls, self.describe)
        c_code = any(map(pybind_base, cls.__mro__))  # its C code: said by its package's version
        methods = [f"c={package_version(cls.__module__)}"] if c_code else []
        if methods == ["c=None"]:
            return None
        for klass in cls.__mro__:
            if klass is object or pybind_base(klass):
                continue
            if klass is not cls and not importable(klass):
                return None
            owner = qualified(klass)
            for name, value in sorted(vars(klass).items()):  # by name: names are unique
                if isinstance(value, _METHOD_LIKE) or (c_code and c_attribute(value)):
                    described = "c" if c_code and c_attribute(value) else self._attribute(value)
                    if described is None:
                        return None
                    methods.append(f"{owner}.{name}={described}")
        if isinstance(cls, enum.EnumMeta):
            # Its members and their values: a member's identity names its class, and code that
            # iterates the class or looks a member up by value folds what the class holds.
            members = self._all((name, member._value_) for name, member in cls._member_map_.items())
            if members is None:
                return None
            methods.append(f"members={members}")
        mro = ",".join(qualified(k) for k in cls.__mro__)
        return f"class:{qualified(cls)}#{short_digest(f'{mro}:{methods}')}"

    def _parametrized(self, cls: type) -> str | None:
        """The class ``register_parametrization`` makes for one module (``Parametrized<Base>``,
        torch's ``_inject_new_class``): no name finds it, so it is described by what made it,
        the class it extends, and all its own namespace holds: the ``__getstate__`` and
        ``__deepcopy__`` torch gives it and a property per parametrized tensor, whose code is
        torch's and whose closures hold the tensor's name and the module the class was made
        for.  That module is said as such: a compile reads it as the instance it is called on
        (it keys torch's parametrization cache by its id, which ``folds`` checks like any id).
        (A class torch made to wrap another: ``identity.distributed``.)"""
        base = cls.__bases__[0]
        inner = Identities()
        inner._instance_of = cls
        parts = [self.describe(base), inner.describe(dict(vars(cls)))]
        if None in parts:
            return None
        return f"parametrized:{parts[0]}#{short_digest(parts[1])}"

    def _attribute(self, value: Any) -> str | None:
        """A function-like class attribute.  A C function a class holds as a static method
        has no module to be imported from; its place in the class names it, and its
        qualname is fixed by the C code that defines it."""
        inner = getattr(value, "__func__", None)
        if isinstance(value, staticmethod) and isinstance(inner, types.BuiltinFunctionType) \
                and getattr(inner, "__module__", None) is None and getattr(inner, "__self__", None) is None:
            return f"staticmethod(builtin {inner.__qualname__})"
        return self.describe(value)


_METHOD_LIKE = (types.FunctionType, staticmethod, classmethod, property, functools.partialmethod,
                functools.cached_property)
