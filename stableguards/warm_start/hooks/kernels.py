"""A cached inductor graph of one of our entries, loaded without C++ build work its kernels do
not need: no precompiled header for a kernel whose binary is there already."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from stableguards.hooks.core import Hook
from stableguards.warm_start.state import STATE


def _load_compiled_graph(call: Any, self: Any, constants: Any) -> Any:
    """Load a cached inductor graph for one of our entries without preparing to compile the
    C++ kernels that are built already (see _precompile_header)."""
    if STATE.loading.get().package is None:
        return call(self, constants)
    with STATE.loading_as(compiled=True):
        return call(self, constants)


def _kernel_source(call: Any, content: Any, extension: str, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """A C++ kernel's source written for a cached graph of ours: where its binary is (see
    _precompile_header)."""
    key, path = call(content, extension, *args, **kwargs)
    if extension == "main.cpp" and STATE.loading.get().compiled:
        # Kept for this load only: the load's scope (loading_as) ends with the graph's.
        STATE.loading.set(dataclasses.replace(STATE.loading.get(), kernel_binary=os.path.splitext(path)[0] + ".so"))
    return key, path


def _precompile_header(call: Any, header: str, hashable_cmd_line: str, **compile_command: Any) -> str | None:
    """No precompiled header for a kernel of a cached graph of ours that is built already.

    Loading a cached CPU graph imports its module, whose C++ kernels are
    usually built in the cache dir already; inductor still runs the
    preprocessor over its kernel header and hashes the output first (0.2 s a
    process here), to name a precompiled header that only a compile would
    use.  A kernel's binary path does not depend on it (inductor computes it
    from the source it has just written, ``_kernel_source``), so a kernel
    whose binary is there goes without one.  A kernel that is not (a new
    machine, whose entries came from a shared store) keeps it: without it the
    build is the same binary, about twice as slow (GPT-2 on a new machine:
    18.4 s against 10.6 s).
    """
    binary = STATE.loading.get().kernel_binary if STATE.loading.get().compiled else None
    if binary is not None and os.path.exists(binary):
        return None
    return call(header, hashable_cmd_line, **compile_command)


HOOKS = [
    Hook("torch._inductor.output_code", "CompiledFxGraph.after_deserialization", "warm_start",
         _load_compiled_graph, params=("constants",), lazy=True),
    Hook("torch._inductor.codecache", "write", "warm_start", _kernel_source, lazy=True),
    Hook("torch._inductor.codecache", "_precompile_header", "warm_start", _precompile_header,
         params=("header", "hashable_cmd_line"), lazy=True),
]
