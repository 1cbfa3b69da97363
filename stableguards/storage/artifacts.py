"""The names torch's artifacts have in the store, and whether the store serves them now.

Shared: the ``store`` part serves torch's remote caches from these names, and the ``keys``
part asks whether a graph is there to explain a local miss.
"""

from __future__ import annotations

import os

from stableguards.storage import STORE_ENV, configured

FX_GRAPHS = "fx_graph"
AOT_ENTRIES = "aot_autograd"
# Kernel binaries by what builds them (``store.binaries``), and what was built from each source.
KERNEL_BINARIES = "kernel_binary"
KERNEL_SOURCES = "kernel_source"


def serves(namespace: str) -> bool:
    """Whether the store stands in for torch's remote cache of ``namespace`` now: one is named,
    torch's remote cache setting is unset, the local cache is on, and caches are not
    force-disabled (a torch setting the user chose keeps its meaning)."""
    if not os.environ.get(STORE_ENV):
        return False
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch.compiler.config as compiler_config

    if compiler_config.force_disable_caches:
        return False
    if namespace == KERNEL_BINARIES:  # inductor's local cache, which has no setting of its own
        return True
    if namespace == FX_GRAPHS:
        return inductor_config.fx_graph_remote_cache is None and bool(inductor_config.fx_graph_cache)
    return functorch_config.enable_remote_autograd_cache is None and bool(functorch_config.enable_autograd_cache)


def holds_fx_graph(key: str) -> bool:
    """Whether the store serves inductor's graphs and has one under ``key`` (its record only:
    whether it verifies is found when torch reads it).  Raises Unavailable."""
    return serves(FX_GRAPHS) and configured(None).has(FX_GRAPHS, name(key))


def name(key: str) -> str:
    """The store's name for torch's key: with this machine's CPU vector ISA (``cpu_isa``)."""
    return f"{key}.{cpu_isa()}"


def cpu_isa() -> str:
    """The CPU vector ISA inductor writes C++ for on this machine (``avx512+avx512_vnni``).  The
    vector width is in the loops it writes, and torch's cache keys do not hold it: what a
    machine with another ISA compiled must be a miss here, never a hit."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa()).replace(" ", "+") or "novec"
