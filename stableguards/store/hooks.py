"""torch's remote FX-graph and AOTAutograd caches, served by the shared store.

inductor looks a compiled graph up in its local cache directory and, where one is
configured, in a "remote" cache; AOTAutograd does the same with its entries.  torch's own
remote caches are Redis with a plain ``SET`` and nothing checked on load.  With
``STABLEGUARDS_STORE`` named, the remote cache torch asks is the store instead: every
artifact under its digest, verified (and signed with ``STABLEGUARDS_STORE_KEY``) before torch
unpickles it.  So a replica on a fresh machine, or a frame warm start leaves out, finds the
graphs another process compiled; torch's keys decide what matches, as with its own remote
caches, with the machine's CPU vector ISA added to each name (torch's key leaves it out, and a
graph's C++ is written for one: see ``storage.artifacts.name``).  The kernel binaries inductor
builds from that C++ go into the store too, by everything that makes one usable
(``store.binaries``): a new machine fetches them instead of building every kernel again.

A torch setting the user chose keeps its meaning: the store stands in only where torch's
remote cache setting is unset (``fx_graph_remote_cache``, ``enable_remote_autograd_cache``),
and only while the local cache is on and caches are not force-disabled.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Any

from stableguards.components import Components, digest_text
from stableguards.events import EVENTS
from stableguards.hooks.core import Hook
from stableguards.storage import ContentStore, Unavailable, Unusable, configured
from stableguards.storage.artifacts import AOT_ENTRIES, FX_GRAPHS, KERNEL_BINARIES, KERNEL_SOURCES, name, serves
from stableguards.store import binaries, messages, pickled


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
                if data is not None and not _is_torchs(namespace, data):
                    raise Unusable("it verifies, but is not an entry torch wrote", "foreign")
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


def _is_torchs(namespace: str, data: bytes) -> bool:
    """Whether ``data`` holds the kind of entry torch takes from this remote cache: the class its
    pickle builds, read without unpickling it (``store.pickled``), is torch's own.  torch
    unpickles it and uses it as one, and crashes the compile on anything else."""
    if namespace == FX_GRAPHS:
        from torch._inductor.output_code import CompiledFxGraph as expected
    else:
        from torch._functorch._aot_autograd.aot_autograd_result import GenericAOTAutogradResult as expected
    module, qualname = pickled.artifact_class(data) or ("", "")
    found = sys.modules.get(module)  # only a module torch has imported: naming one imports nothing
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return isinstance(found, type) and issubclass(found, expected)


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


def _builder(call: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """inductor prepares a C++ build, in the compiling thread: marked to be served by the store
    if it serves kernel binaries now (``_build`` runs on inductor's worker threads)."""
    call(self, *args, **kwargs)
    if serves(KERNEL_BINARIES):
        self.stableguards_store = True


def _build(call: Any, builder: Any) -> None:
    """inductor builds a C++ kernel (or a probe of the CPU's vector ISA) into a shared library:
    fetched from the store where a machine like this one built it; published once built here.
    Only a local build of a library is served (not an object file or a remote build); a
    precompiled header waits for the first kernel built here that includes it."""
    if not getattr(builder, "stableguards_store", False) or builder._use_relative_path:
        return call(builder)
    if builder._precompiling:
        _DEFERRED_HEADERS[builder.get_target_file_path()] = builder
        return None
    if not builder._do_link:
        return call(builder)
    try:
        key = _binary_key(builder)
    except OSError:  # a source named by a path with a space in it: built, as torch would
        return call(builder)
    target = Path(builder.get_target_file_path())
    store = configured(None)  # the compiling thread's environment is the process's
    with EVENTS.timed("kernel binary fetch"):
        data = _fetched(store, key)
    if data is not None:
        _write_atomically(target, data)
        return None
    _precompile_header_for(builder, call.fn)
    call(builder)
    with EVENTS.timed("kernel binary publish"):
        _publish(store, key, target)
    return None


# Precompiled headers not built yet, by the file each makes.  inductor precompiles the header a
# kernel includes before it knows whether the kernel's library is there to load (about 150 MB and
# seconds of build each); a kernel fetched from the store needs none.  So the build waits for the
# first kernel that is built here, as torch would have built it: under torch's lock for that
# header, unless a process built it meanwhile.  A kernel built elsewhere (a compile worker
# process) before that includes the header's text instead: the same library, built slower.
_DEFERRED_HEADERS: dict[str, Any] = {}
_HEADERS_LOCK = threading.Lock()


def _precompile_header_for(builder: Any, build: Any) -> None:
    header = builder._build_option.precompiled_header
    if not header:
        return
    with _HEADERS_LOCK:
        for target in [t for t in _DEFERRED_HEADERS if t.startswith(header + ".")]:
            deferred = _DEFERRED_HEADERS.pop(target)
            from torch._inductor.codecache import _HEADER_LOCK_DIR
            from torch.utils._filelock import FileLock

            os.makedirs(_HEADER_LOCK_DIR, exist_ok=True)
            with FileLock(os.path.join(_HEADER_LOCK_DIR, Path(header).stem + ".lock")):
                if not os.path.isfile(target):
                    build(deferred)


def _binary_key(builder: Any) -> Components:
    import torch
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from torch._inductor.codecache import _HEADER_DIR

    # A precompiled header is named by a digest of everything it holds (its text, every header
    # it includes, its command and compiler): it is a source by that name.
    header = builder._build_option.precompiled_header
    paths = [*builder._sources_args.split(), *([header] if header else [])]
    sources = {path: Path(path).read_bytes() for path in paths}
    directories = {"cache": cache_dir(), "headers": _HEADER_DIR, "torch": str(Path(torch.__file__).parent),
                   "python include": sysconfig.get_paths()["include"], "prefix": sys.prefix}
    return binaries.binary_key(builder.get_command_line(), sources, directories, _compiler(builder._compiler),
                               f"{torch.__version__} {torch.version.git_version}", _platform())


@functools.cache
def _compiler(compiler: str) -> str:
    """What the compiler says it is (``g++ --version``'s first line)."""
    proc = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    return (proc.stdout.splitlines() or [""])[0]


@functools.cache
def _platform() -> str:
    return " ".join((sys.platform, platform.machine(), sysconfig.get_config_var("SOABI") or "", *platform.libc_ver()))


def _fetched(store: ContentStore, key: Components) -> bytes | None:
    """The binary under ``key``, verified; None on a miss (said once where the store has the
    same sources built with another compiler, torch or platform) or when unreadable (warned)."""
    try:
        data = store.fetch(KERNEL_BINARIES, key.digest)
        if data is None:
            other = store.fetch(KERNEL_SOURCES, _sources_name(key))
            if other is not None:
                messages.built_elsewhere(store.describe(), key.differing(Components.of(json.loads(other))))
            return None
    except (Unusable, Unavailable, ValueError, TypeError) as error:  # TypeError: a record not of pairs
        messages.unreadable(KERNEL_BINARIES, store.describe(), error)
        return None
    messages.read(KERNEL_BINARIES)
    return data


def _sources_name(key: Components) -> str:
    return digest_text(repr([(n, v) for n, v in key.items if n.startswith("source ")]))


def _publish(store: ContentStore, key: Components, target: Path) -> None:
    try:
        store.publish(KERNEL_BINARIES, key.digest, target.read_bytes())
        store.publish(KERNEL_SOURCES, _sources_name(key), json.dumps(key.items).encode())
    except (Unavailable, OSError) as error:
        messages.unwritable(KERNEL_BINARIES, store.describe(), error)
        return
    messages.written(KERNEL_BINARIES)


def _write_atomically(target: Path, data: bytes) -> None:
    """Where torch will ``dlopen`` it: written whole under another name, then renamed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)


HOOKS += [Hook("torch._inductor.cpp_builder", "CppBuilder.__init__", "store", _builder, lazy=True),
          Hook("torch._inductor.cpp_builder", "CppBuilder.build", "store", _build, lazy=True, any_thread=True)]
