"""The hook layer's own process state: installed seams and work waiting for a safe moment.

Each feature keeps its own state in its package (``stableguards.<feature>.state``);
counters, explanations and warnings go to the event log (``stableguards.events``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from stableguards.events import EVENTS


def mid_import(module: Any) -> bool:
    """Whether ``module`` is in ``sys.modules`` but still running its body."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class ProcessState:
    """What the hook layer keeps for this process: the seams it patched, the parts in place,
    and work waiting for a safe moment."""

    def __init__(self) -> None:
        # (owner, attribute) -> the seam there (torch's original, the hooks on it).
        self.seams: dict[tuple[Any, str], Any] = {}
        self.installed: set[str] = set()
        self._pending: list[Callable[[], None]] = []
        self._after_import: dict[str, list[Callable[[Any], None]]] = {}
        # Custom operators (hooks.operators): operator -> dispatch key -> the Python kernel seen
        # registered there (operators.Recorded).
        self.kernels: dict[str, dict[str, Any]] = {}

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
                    EVENTS.fell_back("cache entry release", error)
        finally:
            lock.release()

    @property
    def pending_releases(self) -> int:
        return len(self._pending)


STATE = ProcessState()

