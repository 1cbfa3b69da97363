"""How a saved entry's guard state is pickled: warm start's rules beside torch's guard pickler.

torch pickles the scope a saved entry's guards are rebuilt from
(``GuardsStatePickler``).  For an entry of ours (``hooks.guards._reduce_code``
applies ``reduce``), objects another process cannot find by torch's rules are
saved as something it can rebuild: a local function's code by its path, a
graph module's class by its home's name, an optimizer and a parametrized module
as what they hold, a view tensor with its layout, a dict subclass through dict's
own storage, and a value no guard reads that pickle cannot save as torch's
sentinel.  The functions that rebuild them are referred to by name from saved
entries.  Plain rules: ``tests/test_warm_pickling.py`` checks them with
``pickle`` alone.
"""

from __future__ import annotations

import copyreg
import pickle
import types
from collections.abc import Callable
from typing import Any

from stableguards.codes import code_at, code_path
from stableguards.identity import fx_home
from stableguards.identity.distributed import wrapper_map
from stableguards.identity.names import by_state, parametrized


def reduce(obj: Any, torch_reduce: Callable[[], Any], pickler: Any) -> Any:
    """The guard pickler saves a local function's code object by its path from an
    importable function (``codes.code_path``), so a restarted process gets
    the code object its live functions share, and an identity check on
    ``fn.__code__`` (``CLOSURE_BY_NAME``) can pass there; and an optimizer as
    the attributes it holds.  Where torch would leave an object to pickle: a dict
    subclass that rewrites its keys by its items, and a value no guard reads that
    pickle cannot save as torch's sentinel.  Other objects, and code without such
    a path, are pickled as torch pickles them (code by value, a fresh code object
    that no live function runs: that check never passes).  Other packages'
    guards are pickled as torch pickles them."""

    if isinstance(obj, types.CodeType):
        path = code_path(obj)
        if path is not None:
            return code_at, path
    if isinstance(obj, type) and (wrapper := wrapper_map(obj)):
        # A class torch made to wrap another (fully_shard's FSDP<Block>): the one its map
        # keeps for the wrapped class in a restarted process (identity.distributed).
        return wrapper_class_at, wrapper
    if isinstance(obj, type) and (home := fx_home.home_of_class(obj)):
        # A graph module's class (torch.fx makes one per graph, local to its __new__): by its
        # home's name, rebuilt against the class registered there in a restarted process.
        return fx_home.class_at, (home,)
    if fx_home.home_of_class(type(obj)):
        # A graph module, as its nn.Module state: what guards on it read (its buffers,
        # parameters, submodules, hooks), without its graph, whose nodes call objects
        # only its home's name stands for.  Its class is checked by identity in the proof.
        import torch

        state = vars(torch.nn.Module())
        return _bare_object, (type(obj),), {k: v for k, v in vars(obj).items() if k in state}, None, None, \
            _set_attributes
    if by_state(obj):
        # An optimizer, as what it holds, without its own __setstate__: Adam's reads each
        # parameter's step count, which torch's pickler prunes where no guard reads it.
        # The rebuilt guards read it along their sources; its id check is bound on the
        # first call (ID_ON_FIRST_CALL).
        return new_object, (type(obj),), vars(obj), None, None, _set_attributes
    reduced = torch_reduce()
    if reduced is NotImplemented and wrapper_map(type(obj)):
        # A module of such a class: pickle makes it with the class's __new__, which fully_shard's
        # FSDPModule turns into an instance of the wrapped class.  Made bare instead, its state
        # set as pickle sets it.
        _, args, *rest = obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
        return (_bare_object, args[:1], *rest)
    if isinstance(reduced, tuple) and getattr(reduced[0], "__name__", None) == "_unpickle_tensor":
        # torch saves a tensor as ``empty_like`` on meta, which drops a view's storage offset (and
        # a non-dense tensor's strides): a guard rebuilt on it (``L['y'].storage_offset() == 2``)
        # would check 0 in every process.  The saved tensor keeps the live one's layout.
        unpickle, (meta, *rest) = reduced
        return _strided_tensor, (unpickle, meta, tuple(obj.stride()), obj.storage_offset(), *rest)
    if reduced is not NotImplemented:
        return reduced  # torch's own reduction, a pruned value's included
    if isinstance(obj, type) and parametrized(obj):
        # A class register_parametrization made for one module, which no name finds: made again
        # by torch, for a bare module of the class it extends.  Its check is bound on the first
        # call (TYPE_ON_FIRST_CALL); what it is, the proof compares (identity._parametrized).
        return _parametrized_class, (obj.__bases__[0], _parametrized_names(obj))
    if parametrized(type(obj)):
        # A parametrized module refuses pickling (its class's __getstate__): its nn.Module state,
        # pruned by torch as any module's, on a module of a class torch makes again alike.
        cls = type(obj)
        return _parametrized_module, (cls.__bases__[0], _parametrized_names(cls)), dict(vars(obj)), None, None, \
            _set_attributes
    if rebuilt_through_its_setitem(obj):
        # Pickle rebuilds a dict subclass by calling its __setitem__ with each saved item,
        # which may change the key again (transformers' output-capture registry stores
        # str(key.__class__): every saved key became "<class 'str'>").  It is rebuilt with
        # the items its storage holds, as dict's own copy would.
        return new_object, (type(obj),), (list(dict.items(obj)), getattr(obj, "__dict__", {})), None, None, \
            set_items_and_attributes
    if unpicklable_bystander(pickler, obj):
        from torch._dynamo.package import _Missing

        return _Missing, ("cannot be pickled, and no guard reads it",)
    return reduced


# What pickle saves itself when the reducer declines, before any __reduce_ex__.
_PICKLED_BY_PICKLE = (dict, set, frozenset, list, tuple, bytearray, types.FunctionType)


def unpicklable_bystander(pickler: Any, obj: Any) -> bool:
    """A value the saved scope holds that pickle cannot save and no guard reads: a ContextVar
    in a global object's ``__dict__`` (transformers' output collector, whose type and
    methods a checkpointed layer's frame guards) would leave the entry out.

    It is saved as torch's ``_Missing``, as torch saves the unsupported types it lists
    (streams, weakrefs, process groups) where no guard reads them.  Sound for the same
    reason: the saved scope only builds the guards (the compiled code runs on the live
    objects), and no guard reads this value; the round trip (``hooks.guards._round_trip``) then checks
    that the guards built from the saved scope prove what the live ones did.  A value
    that a guard reads, or that a container carried whole holds, is left to pickle: it
    fails, and the entry is left out."""
    if id(obj) in pickler.guard_tree_values or id(obj) in getattr(pickler, "_verbatim_elements", ()):
        return False
    kind = type(obj)
    if kind in _PICKLED_BY_PICKLE or isinstance(obj, type) or kind in getattr(pickler, "dispatch_table",
                                                                             copyreg.dispatch_table):
        return False
    try:
        obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)  # what pickle calls next
    except Exception:  # noqa: BLE001 - TypeError, or pybind11's RuntimeError for a C++ function record
        return True
    return False


def rebuilt_through_its_setitem(obj: Any) -> bool:
    """A dict subclass with its own ``__setitem__`` that pickle would save as any object
    (no reduce, state or slots of its own): rebuilt through that ``__setitem__``."""
    kind = type(obj)
    return (isinstance(obj, dict) and kind.__setitem__ is not dict.__setitem__
            and kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__
            and getattr(kind, "__getstate__", None) is getattr(object, "__getstate__", None)
            and not hasattr(kind, "__setstate__") and not copyreg._slotnames(kind))


def set_items_and_attributes(obj: dict, state: tuple[list, dict]) -> None:
    items, attributes = state
    dict.update(obj, items)
    if attributes:
        obj.__dict__.update(attributes)


def _strided_tensor(unpickle: Any, meta: Any, stride: tuple[int, ...], offset: int, *rest: Any) -> Any:
    """torch's saved tensor (``reduce``), on a meta tensor with the saved strides and offset."""
    import torch

    extent = 1 + sum((size - 1) * step for size, step in zip(meta.shape, stride)) if meta.numel() else 0
    base = torch.empty(offset + extent, dtype=meta.dtype, device="meta", requires_grad=False)
    laid_out = base.as_strided(meta.shape, stride, offset).detach().requires_grad_(meta.requires_grad)
    return unpickle(laid_out, *rest)


def _parametrized_names(cls: type) -> tuple[str, ...]:
    return tuple(name for name, value in vars(cls).items() if isinstance(value, property))


def _parametrized_module(base: type, names: tuple[str, ...]) -> Any:
    """A bare module of ``base`` whose class torch's parametrize made, with a property for each
    of ``names`` (its state is set next, as pickle does)."""
    from torch.nn.utils import parametrize

    module = base.__new__(base)
    parametrize._inject_new_class(module)
    for name in names:
        parametrize._inject_property(module, name)
    return module


def _parametrized_class(base: type, names: tuple[str, ...]) -> type:
    return type(_parametrized_module(base, names))


def wrapper_class_at(module: str, name: str, wrapped: type) -> type:
    """The class torch's map ``module.name`` keeps for ``wrapped``; where it keeps none (nothing
    was wrapped so far), a class of that name no object has, so the check on it fails."""
    import importlib

    found = getattr(importlib.import_module(module), name).get(wrapped)
    return found if found is not None else type(f"NotYetWrapped{wrapped.__name__}", (), {})


def new_object(cls: type) -> Any:
    return cls.__new__(cls)


def _bare_object(cls: type) -> Any:
    """An instance of ``cls`` made without its ``__new__``: ``GraphModule.__new__`` makes a new
    class for every instance."""
    return object.__new__(cls)


def _set_attributes(obj: Any, attributes: dict) -> None:
    obj.__dict__.update(attributes)
