"""What tracing a frame for a saved entry read that its guards do not say: the record of one
compile in flight, filled by ``hooks.tracing`` and read by the proof (``hooks.proofs``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


# An nn.Module's call and forward, by code name: a module called in the compiled code.
_MODULE_CALLS = frozenset({"_call_impl", "_wrapped_call_impl", "__call__", "forward"})


@dataclass
class ConstantCall:
    """An ``assume_constant_result`` call made while tracing (recorded, never repeated there),
    or a call Dynamo folded without a guard (``hooks.tracing._record_folded``)."""

    fn: Any
    args: tuple
    kwargs: dict
    result: Any


@dataclass
class Traced:
    """What tracing a frame for a saved entry read that its guards do not say: the functions
    it inlined with their globals, ``assume_constant_result`` calls, the environment
    variables it read (None: the whole environment, which cannot be checked); the resume
    functions torch installed for it, which a package restores; and the functions its graphs
    run without Dynamo tracing them."""

    inlined: list[tuple[Any, dict]] = field(default_factory=list)
    constants: list[ConstantCall] = field(default_factory=list)
    environ: set[str] | None = field(default_factory=set)
    resumes: set[str] = field(default_factory=set)
    untraced: list[tuple[str, Any]] = field(default_factory=list)  # (label, function): signals.runs_untraced
    untraced_sources: list[Any] = field(default_factory=list)  # where such functions came from (Sources)
    # Graphs whose attributes are tensors checked by id (graph_params): backend id -> the
    # sources (Sources) of the tensors its compiled code takes first (None: one has no source).
    graph_params: dict[str, tuple[Any, ...] | None] = field(default_factory=dict)
    graph_tensors: set[int] = field(default_factory=set)  # ids of those tensors
    state_inits: list[Any] = field(default_factory=list)  # optimizer_init.StateInit: state the trace filled
    operators: dict[str, Any] = field(default_factory=dict)  # custom operators the trace called, by name
    # What values the trace folded depend on (facts.SEED, facts.ADDRESS) -> the first such value.
    per_process: dict[str, str] = field(default_factory=dict)
    hash_ordered: dict[str, str] = field(default_factory=dict)  # set constants in hash order, likewise
    # Sources whose object's id the trace folded and used only as a key (folds.memo_key): their id
    # checks are bound on the entry's first call.
    memo_keys: set[str] = field(default_factory=set)
    # Sources of modules called inside the compiled code (None: one without a source).
    called_modules: set[str | None] = field(default_factory=set)
    # Codes of the ``forward``s run on the frame's own module (L['self']) inside the compiled
    # code: another class's (``super().forward``) runs no hooks; its own would be a call again.
    own_forwards: set[Any] = field(default_factory=set)

    def inline(self, code: Any, scope: dict, arguments: dict[str, Any]) -> None:
        """A function inlined, with its globals and its arguments (VariableTrackers)."""
        self.inlined.append((code, scope))
        if code.co_name in _MODULE_CALLS and "self" in arguments:
            # A module called (or its forward run) inside the compiled code: its hooks may run there.
            source = getattr(arguments["self"], "source", None)
            name = getattr(source, "name", None) if source is not None else None
            if code.co_name == "forward" and name == "L['self']":
                self.own_forwards.add(code)
            else:
                self.called_modules.add(name)
        environ = type(os.environ)
        if code is environ.__getitem__.__code__:  # os.getenv, environ.get and `in` all come here
            key = arguments.get("key")
            try:
                name = key.as_python_constant()
            except Exception:  # noqa: BLE001 - a key Dynamo does not know as a constant
                self.environ = None
                return
            if self.environ is not None and isinstance(name, str):
                self.environ.add(name)
        elif any(code is getattr(environ, m).__code__ for m in ("__iter__", "__len__", "copy")):
            self.environ = None  # the whole environment
