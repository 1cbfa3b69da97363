"""Names and kinds: what stands for an object in every process (a module of globals, a builtin's
import name, a package version, a tensor's metadata), and which objects are of a kind the
identity rule treats apart (a module copy, a parametrized class, an optimizer).  Plain Python."""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

from stableguards.codes import qualified, resolve
from stableguards.components import digest_text

PARAMETRIZE = "torch.nn.utils.parametrize"
OPTIMIZER = "torch.optim.optimizer.Optimizer"
TENSOR = "torch._C.TensorBase"

# Types whose repr is their whole value in every process, by qualified name.
BY_REPR = frozenset({
    "torch.dtype", "torch.device", "torch.layout", "torch.memory_format", "torch.Size",
    "torch._ops.OpOverload", "torch._ops.OpOverloadPacket", "torch._ops._OpNamespace",
    "torch._ops.HigherOrderOperator",
})
# DTensor placements whose repr shows every field they have (C++ classes: a dim, a reduce op), when
# nothing was set on the instance besides.
PLACEMENTS = frozenset(f"torch.distributed.tensor.placement_types.{name}" for name in ("Shard", "Replicate", "Partial"))
# Builtin types an enum mixes in (IntEnum, StrEnum, IntFlag), and the data of a member as that
# type, read past any method of the enum's that would say otherwise.
ENUM_MIXINS = {int: int.__int__, float: float.__float__, complex: complex.__complex__, str: str.__str__,
               bytes: bytes.__bytes__}
# Classes whose instances, used as decorators, are what their class's code does with their state.
CONTEXT_DECORATORS = frozenset({"torch.utils._contextlib._DecoratorContextManager",
                                "torch._dynamo.eval_frame._TorchDynamoContext"})
# What the enum machinery keeps on each member; its value and name are described on their own.
ENUM_BOOKKEEPING = frozenset({"_value_", "_name_", "__objclass__", "_sort_order_"})


def module_copy(obj: Any) -> bool:
    """Whether ``obj`` is a module loaded from a file apart from ``sys.modules``, which holds
    another module under its name (torch's polyfills run ``operator.py`` again without its C
    accelerator: ``sum()`` reaches it).  No name finds it in another process: an id check on
    it is bound, there, to the object found on the call the entry first serves, as a copy of
    the same module from the same file."""
    held = sys.modules.get(getattr(obj, "__name__", None)) if isinstance(obj, types.ModuleType) else None
    return isinstance(held, types.ModuleType) and held is not obj and isinstance(getattr(obj, "__file__", None), str)


def parametrized(cls: type) -> bool:
    """Whether ``cls`` is the class ``torch.nn.utils.parametrize`` made for one module."""
    return (cls.__module__ == PARAMETRIZE and len(cls.__bases__) == 1
            and cls.__qualname__ == f"Parametrized{cls.__bases__[0].__name__}")


def by_state(obj: Any) -> bool:
    """Whether ``obj``'s identity is what it holds (an optimizer), not a name another process
    imports: an id check on it is bound, in another process, to the object found on the
    call the entry first serves, once its identity is proved there."""
    return is_a(type(obj), OPTIMIZER)


def module_of_globals(scope: dict) -> str | None:
    """The name of the module whose globals ``scope`` is.  Its ``__name__`` can be another
    (``_collections_abc`` calls itself ``collections.abc``); its spec names it."""
    spec = scope.get("__spec__")
    for name in (getattr(spec, "name", None), scope.get("__name__")):
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is not None and vars(module) is scope:
            return name
    return None


def builtin(fn: types.BuiltinFunctionType) -> str | None:
    """A builtin function by where it is imported from: its qualname in its module, or
    its name (torch's functions live on a class but are exported by the module)."""
    name = getattr(fn, "__module__", None) or ""
    module = sys.modules.get(name)
    if module is None:
        return None
    for path in dict.fromkeys((fn.__qualname__, fn.__name__)):
        try:
            if resolve(name, path) is fn:
                version = package_version(module.__name__)
                return None if version is None else f"builtin:{module.__name__}.{path}{version}"
        except AttributeError:
            continue
    return None


@functools.cache
def package_version(module: str) -> str | None:
    """What fixes a C function's code besides its name: nothing more for the interpreter's own
    modules and torch's (the key holds Python's and torch's versions), else its package's
    version; None where it has none (a C extension of the user's: no identity)."""
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top in ("builtins", "torch") or top in sys.builtin_module_names:
        return ""
    version = getattr(sys.modules.get(top), "__version__", None)
    return f"@{version}" if isinstance(version, str) else None


def fx_graph_class(cls: type) -> bool:
    """The class torch.fx makes for each graph module (``GraphModuleImpl``, local to
    ``GraphModule.__new__``): not importable, and told apart by its methods, its ``forward``
    being the graph's code in the globals of the module ``identity.fx_home`` names."""
    return (cls.__module__, cls.__qualname__) == ("torch.fx.graph_module",
                                                  "GraphModule.__new__.<locals>.GraphModuleImpl")


# Types with one instance each and no name to import them by (``NoneType`` is not in ``builtins``).
SINGLETON_TYPES = (type(None), type(Ellipsis), type(NotImplemented))


def pybind_base(cls: type) -> bool:
    """Whether ``cls`` is the base pybind11 gives the classes a C extension defines: its code and
    theirs is the extension's, fixed by the version of the package that holds them."""
    return qualified(cls) == "pybind11_builtins.pybind11_object"


def c_attribute(value: object) -> bool:
    """Whether a class attribute is C code (a pybind11 method, a property or static method of
    C functions) with no name of its own to import: its class's package version says it."""
    if isinstance(value, property):
        return all(f is None or c_attribute(f) for f in (value.fget, value.fset, value.fdel))
    if isinstance(value, (staticmethod, classmethod)):
        return c_attribute(value.__func__)
    return isinstance(value, types.BuiltinFunctionType) or type(value).__name__ == "instancemethod" and \
        isinstance(getattr(value, "__func__", None), types.BuiltinFunctionType)


def importable(cls: type) -> bool:
    """Whether the class's module holds it under its qualname (a local class is not)."""
    try:
        return resolve(cls.__module__, cls.__qualname__) is cls
    except (KeyError, AttributeError):
        return False


# The interpreter's own types that its module does not hold by their name but ``types`` does
# (a bound method's type calls itself ``builtins.method``): fixed C types, the same in every
# process of one Python, named where they can be imported from.
# Of two names (FunctionType, LambdaType), the first: later items of the reversed order win.
TYPES_MODULE_NAMES = {value: f"types.{name}" for name, value in sorted(vars(types).items(), reverse=True)
                       if isinstance(value, type) and not name.startswith("_") and value not in SINGLETON_TYPES
                       and not importable(value)}


SCALARS = (bool, int, float, type(None))
CHECKED = "<checked by the entry's guards>"


def is_a(cls: type, name: str) -> bool:
    return any(qualified(k) == name for k in cls.__mro__)


def graph_tensor(obj: Any) -> str | None:
    """A tensor a compiled graph takes in front of its inputs (``hooks.graph_params``), by what
    its compiled code sees of it; its values are read when the code runs."""
    return tensor_identity(obj) if is_a(type(obj), TENSOR) else None


def tensor_identity(tensor: Any) -> str | None:
    """A tensor by what a compile sees of it without reading its values: what a tensor's
    guard (TENSOR_MATCH) checks, its storage offset and whether it is a leaf."""
    import torch

    try:
        return (f"tensor:{type_name(tensor)}({tensor.dtype}, {tuple(tensor.shape)}, {tensor.stride()}, "
                f"offset={tensor.storage_offset()}, {tensor.device}, requires_grad={tensor.requires_grad}, "
                f"leaf={tensor.is_leaf}, {torch._C._dispatch_keys(tensor)})")
    except Exception:  # noqa: BLE001 - a sparse or otherwise strideless tensor: no identity
        return None


def short_digest(details: str) -> str:
    """Long descriptions (a class's methods, a closure) as a digest beside the object's name."""
    return digest_text(details)[:32]


def type_name(obj: Any) -> str:
    return qualified(type(obj))


def label(obj: Any) -> str:
    return qualified(obj) if isinstance(obj, type) else type_name(obj)
