"""torch's remote FX-graph and AOTAutograd caches, served by the shared store.

inductor looks a compiled graph up in its local cache directory and, where one is
configured, in a "remote" cache; AOTAutograd does the same with its entries.  torch's own
remote caches are Redis with a plain ``SET`` and nothing checked on load.  With
``STABLEGUARDS_STORE`` named, the remote cache torch asks is the store instead: every
artifact under its digest, verified (and signed with ``STABLEGUARDS_STORE_KEY``) before torch
unpickles it.  So a replica on a fresh machine, or a frame warm start leaves out, finds the
graphs another process compiled; torch's keys decide what matches, as with its own remote
caches, with the machine's CPU vector ISA added to each name (torch's key leaves it out, and a
graph's C++ is written for one: see ``storage.artifacts.name``).

A torch setting the user chose keeps its meaning: the store stands in only where torch's
remote cache setting is unset (``fx_graph_remote_cache``, ``enable_remote_autograd_cache``),
and only while the local cache is on and caches are not force-disabled.
"""

from __future__ import annotations

from typing import Any

from stableguards.hooks.core import Hook
from stableguards.storage import ContentStore, Unavailable, Unusable, configured
from stableguards.storage.artifacts import AOT_ENTRIES, FX_GRAPHS, name, serves
from stableguards.store import messages


def _use_remote_fx_graph_cache(call: Any) -> bool:
    """Whether inductor asks a remote cache for compiled graphs: the store, if it serves."""
    return True if serves(FX_GRAPHS) else call()


def _use_remote_autograd_cache(call: Any) -> bool:
    """Whether AOTAutograd asks a remote cache for its entries: the store, if it serves."""
    return True if serves(AOT_ENTRIES) else call()


def _fx_graph_remote_cache(call: Any) -> Any:
    """The remote cache inductor reads and writes compiled graphs in: the store, if it serves."""
    return _store_cache(FX_GRAPHS) if serves(FX_GRAPHS) else call()


def _autograd_remote_cache(call: Any) -> Any:
    """The remote cache AOTAutograd reads and writes its entries in: the store, if it serves."""
    return _store_cache(AOT_ENTRIES) if serves(AOT_ENTRIES) else call()


def _store_cache(namespace: str) -> Any:
    """torch's RemoteCache (JSON values, as its Redis caches take) over the store."""
    from torch._inductor.remote_cache import RemoteCache, RemoteCacheBackend, RemoteCacheJsonSerde

    class StoreBackend(RemoteCacheBackend[bytes]):
        def __init__(self, store: ContentStore) -> None:
            super().__init__()
            self.store = store

        def _get(self, key: str) -> bytes | None:
            try:
                data = self.store.fetch(namespace, name(key))
            except (Unusable, Unavailable) as error:  # one warning, then torch compiles as on a miss
                messages.unreadable(namespace, self.store.describe(), error)
                return None
            if data is not None:
                messages.read(namespace)
            return data

        def _put(self, key: str, data: bytes) -> None:
            try:
                self.store.publish(namespace, name(key), data)
            except Unavailable as error:
                messages.unwritable(namespace, self.store.describe(), error)
                return
            messages.written(namespace)

    class StableguardsStore(RemoteCache[Any]):  # the name TORCH_LOGS=cache reports
        pass

    return StableguardsStore(StoreBackend(configured(None)), RemoteCacheJsonSerde())


_FX = "torch._inductor.compile_fx"
_AOT_RESULT = "torch._functorch._aot_autograd.aot_autograd_result"
_AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"
HOOKS = [
    # Each module imported the function by name: its copy is the one it calls.  inductor's
    # compile (look up, save) and AOTAutograd's load of the graphs its entry names.
    Hook(_FX, "should_use_remote_fx_graph_cache", "store", _use_remote_fx_graph_cache, lazy=True),
    Hook(_AOT_RESULT, "should_use_remote_fx_graph_cache", "store", _use_remote_fx_graph_cache, lazy=True),
    # AOTAutograd's look up (aot_autograd) and saves (graph_compile, a backward's on first use).
    Hook("torch._functorch.aot_autograd", "should_use_remote_autograd_cache", "store",
         _use_remote_autograd_cache, lazy=True),
    Hook("torch._functorch._aot_autograd.graph_compile", "should_use_remote_autograd_cache", "store",
         _use_remote_autograd_cache, lazy=True),
    Hook("torch._inductor.codecache", "FxGraphCache.get_remote_cache", "store", _fx_graph_remote_cache, lazy=True),
    Hook(_AUTOGRAD_CACHE, "AOTAutogradCache.get_remote_cache", "store", _autograd_remote_cache, lazy=True),
]
