"""The one home for stableguards' process state.

Everything the hooks remember between calls lives on ``STATE``: the manager
(counters, explanations, the profile session), the installed seams, warnings
already given, releases waiting for a safe moment, and each feature's tables.
Tests call ``STATE.reset()`` to start clean.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from stableguards.backend_match import BackendKey, Fingerprinter, IdentityTable
from stableguards.cudagraph_checks import StaticInputWatch
from stableguards.manager import GuardManager
from stableguards.optimizer_guards import OptimizerLives

log = logging.getLogger("stableguards")

# Warning keys remembered at most: a long job must not grow memory by warning.
_MAX_WARNED = 1024
# Dynamo sources of the graph inputs of this many recent compiles (cudagraph names).
_MAX_COMPILES_NAMED = 256


def mid_import(module: Any) -> bool:
    """Whether ``module`` is in ``sys.modules`` but still running its body."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class WarmStartTables:
    """What hooks.precompile keeps: our packages, the entries they loaded, what is being compiled."""

    def __init__(self) -> None:
        # Packages stableguards made (hooks.precompile._optimize) -> their Ours record.  Only
        # these are keyed, loaded, saved or touched by any warm-start hook.
        self.ours: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        # The frame being compiled for one of our packages (for explanations); None otherwise.
        self.frame: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            "stableguards_warm_frame", default=None)
        # Whether an AOTAutograd entry of ours is being made: bundled (self-contained), as a
        # package saves its graphs from them.  Set for our compiles and for the backward
        # of one of our graphs compiled on first use.
        self.bundling: contextvars.ContextVar[bool] = contextvars.ContextVar(
            "stableguards_warm_bundling", default=False)
        # The backend ids (__compiled_fn_N_<uuid>) of graphs compiled for our packages.
        self.backend_ids: set[str] = set()
        # The backend id whose backward is being compiled on first use, for a graph of ours.
        self.backward_of: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            "stableguards_warm_backward_of", default=None)
        # Backend ids whose graphs cannot be saved -> why (hooks.precompile._leave_out).
        self.unsaveable: dict[str, str] = {}
        # Whether inductor is loading a graph for one of our entries (hooks.precompile._load_compiled_graph).
        self.loading_compiled: contextvars.ContextVar[bool] = contextvars.ContextVar(
            "stableguards_warm_loading_compiled", default=False)
        # by_code(code) -> (key digest, weak package) of the entries installed on it.
        self.installed: dict[tuple[int, Any], tuple[str, weakref.ref]] = {}
        # by_code(code) -> the keys of every compiled context made for it ("other": no key).
        self.contexts: dict[tuple[int, Any], set[str]] = {}
        # Keys of the entries this process saved (never loaded back by it).
        self.saved_here: set[str] = set()
        # Packages whose save waits for a graph compiled later (a backward) -> the frame's name.
        self.pending: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        # The package whose entries are being installed (hooks.precompile._install).
        self.installing: contextvars.ContextVar[Any] = contextvars.ContextVar(
            "stableguards_warm_installing", default=None)
        # by_code(code) -> loaded entries not yet in Dynamo's cache, in the order tried
        # (hooks.precompile.LoadedEntry).
        self.loaded: dict[tuple[int, Any], list[Any]] = {}
        # The proof of the entry whose guards are being saved (hooks.precompile._serialize_guards).
        self.proof: contextvars.ContextVar[Any] = contextvars.ContextVar("stableguards_warm_proof", default=None)
        # Whether saved guards are being loaded back to be checked (hooks.precompile._round_trip).
        self.checking: contextvars.ContextVar[bool] = contextvars.ContextVar("stableguards_warm_checking",
                                                                             default=False)
        # What tracing the frame being compiled for a saved entry read beyond its guards
        # (hooks.warm_proof.Traced); None outside such a compile.
        self.traced: contextvars.ContextVar[Any] = contextvars.ContextVar("stableguards_warm_traced", default=None)

    def drop_loaded(self, package: Any = None) -> None:
        """Forget the loaded entries of ``package`` (of every package if None)."""
        for row, entries in list(self.loaded.items()):
            kept = [e for e in entries if package is not None and e.package() not in (package, None)]
            if kept:
                self.loaded[row] = kept
            else:
                del self.loaded[row]

    @staticmethod
    def by_code(code: Any) -> tuple[int, Any]:
        """A table key for a code object by identity.  Code objects compare equal by
        content, file aside: ``fn`` in two modules, at the same line with the same
        body, would share one row.  The key holds the code, so its id stays its own."""
        return id(code), code

    def forget_process(self) -> None:
        """What a restarted process would not know: what it saved and installed, and which
        contexts it made (for tests that restart within one process)."""
        self.saved_here.clear()
        self.contexts.clear()
        self.installed.clear()


class ProcessState:
    """What stableguards keeps for this process."""

    def __init__(self) -> None:
        self.manager = GuardManager(disabled=os.environ.get("STABLEGUARDS_DISABLE", ""))
        # (owner, attribute) -> the seam there (torch's original, the hooks on it).
        self.seams: dict[tuple[Any, str], Any] = {}
        self.installed: set[str] = set()
        self._warned: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._pending: list[Callable[[], None]] = []
        self._after_import: dict[str, list[Callable[[Any], None]]] = {}
        # backends: the key of the backend the current frame compiles for.
        self.current_key: contextvars.ContextVar[BackendKey | None] = contextvars.ContextVar(
            "stableguards_backend_key", default=None)
        self.fingerprinter: Fingerprinter | None = None  # set by hooks.backends
        # optimizers: the name of the compiler the current frame compiles for.
        self.compiler_name: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            "stableguards_compiler_name", default=None)
        self.optimizer_lives: OptimizerLives | None = None  # set by hooks.optimizers
        # What each trace (by its TracingContext) saw of optimizers: hooks.optimizers._Trace.
        self.optimizer_traces: IdentityTable[Any] = IdentityTable()
        # ShapeEnv -> how many guards it had when AOTAutograd started tracing with it.
        self.aot_guards_from: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # id(inductor's decomposition table) -> (it, its copy with hooks.optimizers' foreach lerp).
        self.decomp_tables: dict[int, tuple[dict, dict]] = {}
        # ShapeEnvs whose graph must not go into AOTAutograd's cache (hooks.optimizers._save_aot).
        self.aot_not_cached: weakref.WeakSet[Any] = weakref.WeakSet()
        # cudagraphs
        self.copied_grads_told: IdentityTable[bool] = IdentityTable()  # optimizers warned about
        self.static_inputs = StaticInputWatch()
        self.input_sources: collections.OrderedDict[Any, list[str]] = collections.OrderedDict()
        self.warm = WarmStartTables()

    def reset(self) -> None:
        """Forget counters, events, warnings and recorded graphs (for tests).

        Tables that track live objects (backend identities, optimizers) stay:
        their finalizers still refer to them.
        """
        self.manager.reset()
        self._warned.clear()
        self.static_inputs = StaticInputWatch()
        self.input_sources.clear()

    # --- warnings and fallbacks ----------------------------------------------------

    def warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned[key] = None
        while len(self._warned) > _MAX_WARNED:
            self._warned.popitem(last=False)
        log.warning(message)

    def warned(self, key: str) -> bool:
        return key in self._warned

    def fell_back(self, hook: str, error: BaseException) -> None:
        self.manager.record_fallback(hook, error)
        self.warn_once(hook, f"stableguards hook {hook!r} failed ({error!r}); using torch's own behaviour")

    # --- cudagraph input names -------------------------------------------------------

    def note_input_sources(self, compile_id: Any, sources: list[str]) -> None:
        self.input_sources[compile_id] = sources
        while len(self.input_sources) > _MAX_COMPILES_NAMED:
            self.input_sources.popitem(last=False)

    # --- hooks whose module was still importing at install --------------------------

    def install_after_import(self, module_name: str, install: Callable[[Any], None]) -> None:
        """``install`` the hooks of a module that was mid-import when stableguards installed
        (the user's first import was that module, and it imported torch._dynamo):
        at the next safe point, once it has finished."""
        self._after_import.setdefault(module_name, []).append(install)

    def _install_imported(self) -> None:
        for name in list(self._after_import):
            module = sys.modules.get(name)
            if module is not None and not mid_import(module):
                for install in self._after_import.pop(name):
                    install(module)

    # --- releasing dead cache entries ---------------------------------------------

    def release_soon(self, release: Callable[[], None]) -> None:
        """Run ``release`` now if no thread is compiling, else at the next safe point.

        Releases run from finalizers, which can fire inside torch's own cache
        work (``torch._dynamo.reset()`` dropping the last reference, say), or on
        one thread while another compiles; walking the cache entries there
        would touch freed memory or entries being built.  Dynamo holds
        ``compile_lock`` during compiles and resets.
        """
        self._pending.append(release)
        self.release_pending()

    def release_pending(self) -> None:
        """Run waiting releases, holding ``compile_lock`` so no compile starts meanwhile."""
        if self._after_import:
            self._install_imported()
        if not self._pending:
            return
        import torch._dynamo.convert_frame as convert_frame

        lock = convert_frame.compile_lock
        # An RLock: acquire() would succeed for the thread that already holds it.
        if lock._is_owned() or not lock.acquire(blocking=False):
            return  # this thread or another is compiling
        try:
            while self._pending:
                release = self._pending.pop()
                try:
                    release()
                except Exception as error:  # noqa: BLE001 - may run from a finalizer: never raise
                    self.fell_back("cache entry release", error)
        finally:
            lock.release()

    @property
    def pending_releases(self) -> int:
        return len(self._pending)


STATE = ProcessState()

