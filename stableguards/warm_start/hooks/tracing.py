"""What tracing a frame for a saved entry reads beyond its guards, recorded as it happens.

Each hook here runs only while a frame is traced for one of our packages
(``STATE.compiling`` is set by ``compile_frame``) and adds to that compile's
``traced.Traced``: resume functions torch installs, ``assume_constant_result``
calls and calls Dynamo folds about this process, custom operators a graph calls,
checkpointing ``context_fn`` sources, inlined functions with the globals they
read; two route a global through a source a restarted process has.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import Any

from stableguards.hooks import operators
from stableguards.hooks.core import Hook
from stableguards.identity.distributed import DEVICE_MESH, PROCESS_GROUP, group_rank
from stableguards.identity.names import type_name
from stableguards.warm_start.state import STATE
from stableguards.warm_start.traced import ConstantCall


def _record_resume(call: Any, self: Any, name: str, *args: Any, **kwargs: Any) -> None:
    """A resume function installed for a compile of ours: the package records and restores it."""
    call(self, name, *args, **kwargs)
    traced = STATE.compiling.get().traced
    if traced is not None:
        traced.resumes.add(name)


def _module_by_alias(call: Any, self: Any, prefix: str, value: Any) -> str:
    """A module a compile of ours loads by a global named after its id in this process (to
    build an ``OrderedDict`` again after the graph, ``torch`` for ``type(t)``): through
    torch's import alias instead, which the package saves and a restarted process installs."""
    if STATE.compiling.get().traced is None or self.package is None or not isinstance(value, types.ModuleType) \
            or sys.modules.get(value.__name__) is not value:
        return call(self, prefix, value)
    return self.root_tx.import_source(value.__name__).global_name


def _globals_through_function(call: Any, self: Any, name: str) -> Any:
    """A global an inlined function reads from a namespace that is no module's (namedtuple's
    ``__new__``, code exec'd into a fresh dict): torch reaches that namespace through a global
    it installs under the dict's id in this process, which a restarted process lacks.  For a
    compile of ours, where the function was reached along a source, the namespace is reached
    along that function's ``__globals__`` instead: the guards check the same dict, at a source
    a restarted process has."""
    from torch._dynamo import symbolic_convert
    from torch._dynamo.source import AttrSource, DictGetItemSource

    source = getattr(getattr(self, "funcvar", None), "source", None)
    if STATE.compiling.get().traced is None or source is None \
            or symbolic_convert._registered_module_for_globals(self.f_globals.get("__name__"), self.f_globals):
        return call(self, name)
    globals_source = AttrSource(source, "__globals__")
    fglobals_vt = symbolic_convert.VariableBuilder(self, globals_source)(self.f_globals)
    return self.f_globals, fglobals_vt, DictGetItemSource(globals_source, name)  # no module: never stdlib's


def _record_constant(call: Any, tx: Any, fn: Any, name: str, args: Any, kwargs: Any) -> Any:
    """An ``assume_constant_result`` function called while tracing for a saved entry: its
    result is a fact of the entry (``warm_start.facts.CONSTANT_RESULT``)."""
    traced = STATE.compiling.get().traced
    if traced is None:
        return call(tx, fn, name, args, kwargs)

    def recorded(*a: Any, **k: Any) -> Any:
        result = fn(*a, **k)
        traced.constants.append(ConstantCall(fn, a, k, result))
        return result

    return call(tx, recorded, name, args, kwargs)


def _record_folded(call: Any, self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
    """A call Dynamo folds into the graph without a guard, whose result is this process's
    place in its job (a rank, a world size, a process group's ranks, whether a device is
    there): a fact of the entry (``CONSTANT_RESULT``), called again in the process that
    loads it.  Rank 1 is never served what was traced on rank 0.  A call whose arguments
    are not plain values (a ``ProcessGroup`` object) leaves the entry out."""
    traced = STATE.compiling.get().traced
    result = call(self, tx, args, kwargs)
    if traced is not None and operators.is_custom(self.value):
        traced.operators[str(self.value)] = self.value  # what it computes is a fact (proofs)
    if traced is not None and folds_process_state(self.value):
        traced.constants.append(ConstantCall(self.value, tuple(map(_plain, args)),
                                                    {k: _plain(v) for k, v in kwargs.items()}, _plain(result)))
    return result


def _record_group_member(call: Any, self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
    """A member of a process group or device mesh that Dynamo evaluates on the real object and
    folds without a guard.  A group's ``rank()`` is recorded as the call ``group_rank(<group
    name>)`` (``identity.distributed``), a fact of the entry and the variant it is kept under,
    as ``dist.get_rank()`` is; what it folds of a group besides (size, backend, name,
    description) is the group's identity.  A mesh's members read its rank map and layout (its
    identity) and this process's global rank (``get_rank``, ``get_coordinate``,
    ``get_local_rank``): any of them folds ``dist.get_rank()``, which is recorded as such."""
    result = call(self, tx, name, args, kwargs)
    traced = STATE.compiling.get().traced
    if traced is None:
        return result
    obj = self.as_python_constant()
    obj = getattr(obj, "real_obj", obj)  # a fake script object stands for a real group
    if name == "rank" and type_name(obj) == PROCESS_GROUP:
        traced.constants.append(ConstantCall(group_rank, (obj.group_name,), {}, _plain(result)))
    elif type_name(obj) == DEVICE_MESH:
        from torch.distributed import distributed_c10d as c10d

        traced.constants.append(ConstantCall(c10d.get_rank, (), {}, c10d.get_rank()))
    return result


def _record_context_fn(call: Any, self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
    """Where a checkpointing ``context_fn`` came from (its source), for a saved entry: Dynamo
    passes it to the graph untraced and unguarded, and the entry's proof checks what the
    function found there reads (``proofs.live_proof``)."""
    traced = STATE.compiling.get().traced
    source = getattr(kwargs.get("context_fn"), "source", None)
    if traced is not None and source is not None:
        traced.untraced_sources.append(source)
    return call(self, tx, args, kwargs)


class _NotPlain:
    """A value Dynamo does not know as a Python constant: no fact can be written about it."""

    def __repr__(self) -> str:
        return "<not a constant>"


def _plain(variable: Any) -> Any:
    try:
        return variable.as_python_constant()
    except Exception:  # noqa: BLE001 - NotImplementedError, or a tracker's own refusal
        return _NotPlain()


@functools.cache
def _process_state_functions() -> frozenset[Any]:
    """What Dynamo folds without a guard that differs between the processes of one job
    (torch/_dynamo/variables/torch.py: ``constant_fold_functions`` and the process-group
    handlers).  Functions of their arguments alone (``torch.is_complex``) and state
    Dynamo guards otherwise (autocast, the default dtype: ``GLOBAL_STATE``) are not here."""
    import torch

    functions = {torch.cuda.is_available, torch.cuda.get_device_properties, torch.accelerator.is_available,
                 torch.backends.mps.is_built}
    if torch.distributed.is_available():
        from torch.distributed import distributed_c10d as c10d

        functions |= {c10d.is_initialized, c10d.get_rank, c10d.get_world_size, c10d.get_process_group_ranks,
                      group_rank}
        functions |= {getattr(c10d, name) for name in ("_get_group_size_by_name", "_get_group_tag",
                                                       "_rank_not_in_group", "_resolve_group_name_by_ranks_and_tag")
                      if hasattr(c10d, name)}
    return frozenset(functions)


def folds_process_state(fn: Any) -> bool:
    try:
        return fn in _process_state_functions()
    except TypeError:  # unhashable
        return False


def _record_inlined(call: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """A function inlined while tracing for a saved entry, with the globals it reads (the
    builtins it reads must not be shadowed there in a restarted process)."""
    traced = STATE.compiling.get().traced
    if traced is not None:
        bound = _signature(call.fn).bind(self, *args, **kwargs).arguments
        traced.inline(bound["code"], bound["funcvar"].get_globals(), _through_cells(bound))
    return call(self, *args, **kwargs)


def _through_cells(bound: dict[str, Any]) -> dict[str, Any]:
    """The inlined function's arguments, with a ``self`` Python keeps in a cell (``_call_impl``,
    whose nested functions read it) read out of it: the module it holds has its source, which
    names the module called (``Traced.inline``).  A cell that cannot be read stays as it is
    (no source: taken as a module that cannot be told)."""
    arguments = bound["symbolic_locals"]
    me = arguments.get("self")
    if type(me).__name__ != "CellVariable":
        return arguments
    try:
        return {**arguments, "self": bound["parent"].output.side_effects.load_cell(me)}
    except Exception:  # noqa: BLE001 - an empty or unreadable cell: left as it is
        return arguments


@functools.cache
def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn)


HOOKS = [
    Hook("torch._dynamo.output_graph", "OutputGraph.install_global_by_id", "warm_start", _module_by_alias,
         params=("prefix", "value")),
    Hook("torch._dynamo.symbolic_convert", "InliningInstructionTranslator.get_globals_source_and_value", "warm_start",
         _globals_through_function, params=("name",)),
    Hook("torch._dynamo.output_graph", "OutputGraph.install_resume_function_global", "warm_start",
         _record_resume, params=("name",)),
    # assume_constant_result calls (builtin.py imports it from here when called).  nn_module's
    # by-name copy runs only for a specialized module, whose NN_MODULE guard is never saved.
    Hook("torch._dynamo.variables.functions", "invoke_and_store_as_constant", "warm_start", _record_constant,
         params=("tx", "fn", "name", "args", "kwargs")),
    Hook("torch._dynamo.variables.torch", "TorchInGraphFunctionVariable.call_function", "warm_start",
         _record_folded, params=("tx", "args", "kwargs")),
    Hook("torch._dynamo.variables.higher_order_ops", "CheckpointHigherOrderVariable._call_function", "warm_start",
         _record_context_fn, params=("tx", "args", "kwargs")),
    Hook("torch._dynamo.symbolic_convert", "InliningInstructionTranslator.__init__", "warm_start", _record_inlined,
         params=("parent", "code", "symbolic_locals", "funcvar")),
    Hook("torch._dynamo.variables.script_object", "CustomClassObjectVariable.call_method", "warm_start",
         _record_group_member, params=("tx", "name", "args", "kwargs")),
]
