"""Releasing the cache entries of something that died (a backend, an optimizer): one home.

Releases run at a safe point (``STATE.release_soon``): never while a compile
or a reset walks the same entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def release_entries(pick: Callable[[Any], bool], why: str) -> int:
    """Invalidate every live cache entry ``pick`` chooses; how many."""
    import torch._C._dynamo.eval_frame as c_eval_frame
    import torch._dynamo.convert_frame as convert_frame

    released = 0
    for ref in list(convert_frame.input_codes.seen):
        code = ref()
        if code is None:
            continue
        for entry in c_eval_frame._debug_get_cache_entry_list(code):
            if pick(entry) and _invalidate(entry.guard_manager, why) is not None:
                released += 1
    return released


def _invalidate(manager: Any, why: str) -> Any:
    """Take ``manager``'s entry out of Dynamo's cache, as ``CheckFunctionManager.invalidate``
    does: the ``DeletedGuardManagerWrapper`` that now stands for it, or None where the entry is
    not in that cache (torch's precompiled list) or was released already."""
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    if isinstance(manager, DeletedGuardManagerWrapper) or None in (getattr(manager, "extra_state", None),
                                                                     getattr(manager, "cache_entry", None)):
        return None
    deleted = DeletedGuardManagerWrapper(why)
    manager.extra_state.invalidate(manager.cache_entry, deleted)
    return deleted


def release_check_functions(check_fns: Iterable[Any], why: str) -> int:
    """Invalidate the entries of these guard functions (CheckFunctionManagers), through torch's
    own ``invalidate``, which also drops each one's guard manager: torch keeps some of them
    alive for good (its finalizer on ``type(G['holder'])``, an immortal ``dict``), and the
    guard manager must not stay with them.  How many were still live."""
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    live = [c for c in check_fns if not isinstance(c.guard_manager, DeletedGuardManagerWrapper)]
    for check_fn in live:
        check_fn.invalidate(obj_str=why)
    return len(live)


class InstalledEntry:
    """A cache entry installed without a CheckFunctionManager (warm start's loaded entries),
    released as torch releases a traced one whose id-checked object died
    (``CheckFunctionManager.invalidate``), so that ``release_check_functions`` takes both."""

    def __init__(self, guard_manager: Any) -> None:
        self.guard_manager = guard_manager

    def invalidate(self, obj_str: str) -> None:
        deleted = _invalidate(self.guard_manager, f"Cache line invalidated because {obj_str} got deallocated")
        if deleted is not None:
            self.guard_manager = deleted
