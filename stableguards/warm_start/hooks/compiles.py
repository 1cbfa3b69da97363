"""A frame compiled for one of our packages, and its entry saved.

``compile_frame`` (slot ``convert_frame.compile``) compiles the frame with our
package in place, recording what tracing read beyond its guards (``tracing``),
and compiles it again without the package if our machinery was in the way.
Then the package's entry is saved (``warm_start.entries``), or kept waiting for a
graph compiled later (a backward, on first use: ``_record_artifact``).  A compile
torch leaves out of the package is named in explain() (``_bypass_package``).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from stableguards.codes import frame_label
from stableguards.events import EVENTS
from stableguards.hooks.core import Hook
from stableguards.hooks.seams import fills
from stableguards.storage import messages as store_messages
from stableguards.warm_start import entries, messages, variants
from stableguards.warm_start.hooks import bundling, graph_params, tracing
from stableguards.warm_start.state import STATE, Ours, Pending
from stableguards.warm_start.traced import Traced


@fills("convert_frame.compile", "warm_start")
def compile_frame(call: Any, self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """A frame starts compiling (``hooks.seams``): compile it for our package, then save its
    entry: every compile, not only on request.

    A compile that fails with our package in the way (bundling, guard saving)
    is compiled again without it, once; the function goes on without a package.
    Only inductor compiles get a package, so a user's backend is never called
    twice; a failure torch raises on purpose (a strict cache's bypass) or
    Dynamo's control flow is not retried."""
    package = getattr(self, "_package", None)
    ours = STATE.ours.get(package) if package is not None else None
    if ours is None or ours.key is None or not package.is_initialized():
        if ours is not None:
            # Never initialized by torch.compile(fn) (a context used as a decorator or
            # a `with` block): torch would fail on it, so this compile goes without.
            self._package = None
        return call(self, frame, *args, **kwargs)
    frame_name = frame_label(frame.f_code)
    traced = Traced()
    before = _contents(package)
    token = STATE.compiling.set(dataclasses.replace(STATE.compiling.get(), frame=frame_name, traced=traced,
                                                    bundling=True))
    try:
        result = call(self, frame, *args, **kwargs)
    except Exception as error:
        if not _retry_without_package(error):
            if ours.pending is None:
                entries.LEASES.release(ours.key.digest)  # a graph break, a skipped frame: nothing saved now
            raise
        failure = error
    else:
        failure = None
    finally:
        STATE.compiling.reset(token)
    if failure is not None:
        from torch._dynamo.exc import PackageError

        self._package = None
        if not isinstance(failure, PackageError):
            # Our machinery in the way: worth a warning.  A PackageError is torch saying what
            # its package cannot hold (a frame whose code it cannot name, a property's
            # getter): named in explain() only.
            EVENTS.fell_back("warm start compile", failure)
        messages.left_out(frame_name, f"compiling it for a saved entry failed ({failure!r:.200}); compiled "
                                      f"again without")
        entries.LEASES.release(ours.key.digest)
        return call.fn(self, frame, *args, **kwargs)
    ours.folded |= {(c.fn.__module__, c.fn.__qualname__, c.args, tuple(sorted(c.kwargs.items())))
                    for c in traced.constants if tracing.folds_process_state(c.fn)
                    and variants.jsonable([c.args, list(c.kwargs.values())])}
    with EVENTS.timed("warm start save"):
        saved = _save(package, ours, frame_name) if _contents(package) != before else None
    if saved is False:
        # Nothing to save: whoever waits for this entry compiles at once, now and after a restart.
        entries.LEASES.give_up(ours.key.digest, f"{frame_name} was left out of warm start, as its explain() says")
    if ours.pending is None:
        entries.LEASES.release(ours.key.digest)  # saved, or nothing to save: nobody need wait
    return result


def _contents(package: Any) -> tuple[int, int, int, int]:
    """What a compile can add to a package: code objects, guarded codes, backends, bypasses.

    A compile that added none (a skipped frame: every frame a backward run
    from a compiled region shows Dynamo under compiled autograd, hundreds per
    step) leaves the entry as it was saved, so it is not written again."""
    codes = package._codes.values()
    return (len(codes), sum(len(c.guarded_codes) for c in codes), sum(len(c.backend_ids) for c in codes),
            sum(bool(getattr(c, "bypassed", False)) for c in codes))


def _retry_without_package(error: Exception) -> bool:
    """A failure that compiling without our package might not have: a backend failure, a
    package error, an internal error or any exception outside Dynamo's own; not Dynamo's
    control flow (a graph break, a skipped frame, a restart), not torch's deliberate
    refusal to cache under ``strict_autograd_cache``."""
    from torch._dynamo import exc
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (BypassAOTAutogradCache, exc.FailOnRecompileLimitHit)):
            return False
        cause = getattr(cause, "inner_exception", None) or cause.__cause__
    if isinstance(error, exc.TorchDynamoException):
        return isinstance(error, (exc.BackendCompilerFailed, exc.InternalTorchDynamoError, exc.PackageError))
    return True


def _save(package: Any, ours: Ours, frame: str) -> bool | None:
    """Save a package's entry, or keep it waiting for a graph compiled later: whether it was
    written (False: nothing to save, or it cannot be; None: it waits).

    A waiting entry outlives its package: ``torch.compile(fn)(x).backward()``
    drops the compiled function, and with it the package, before the backward
    compiles.  Its last entry (plain data: codes, serialized guards) is kept
    and saved when the artifact arrives (``_record_artifact``)."""
    entry = package.cache_entry()
    if (written := _written(entry, ours, frame)) is not None:
        if (record := ours.pending) is not None:
            ours.pending = None
            record.orphan.detach()
        return written
    record = ours.pending
    if record is None:
        messages.pending(frame)
        entries.LEASES.shorten(ours.key.digest)
        record = ours.pending = Pending(frame, ours, entry)
        record.orphan = weakref.finalize(package, STATE.orphans.append, record)
        record.orphan.atexit = False
    record.entry, record.frame = entry, frame
    return None


def _written(entry: Any, ours: Ours, frame: str) -> bool | None:
    """Write ``entry`` to the store: whether it was written (False: nothing to save, or it
    cannot be); None while a graph's artifact is still to come."""
    from torch._dynamo.precompile_context import PrecompileContext

    if not any(code.guarded_codes for code in entry.codes):
        return False
    if unsaveable := [STATE.unsaveable[bid] for bid in entry.backend_ids if bid in STATE.unsaveable]:
        messages.left_out(frame, f"a backward compiled on first use cannot be saved: {unsaveable[0]}")
        return False
    if any(PrecompileContext.serialize_artifact_by_key(bid) is None for bid in entry.backend_ids):
        # A training graph's AOTAutograd entry exists once its backward has
        # compiled, on first use: saved then (_record_artifact).
        return None
    try:
        entries.publish(ours.key, ours.code, _entry_bytes(entry), variants.dumps(ours.folded) if ours.folded else None)
    except Exception as error:  # noqa: BLE001 - an entry torch cannot pickle, or an unreachable store
        if not isinstance(error, RuntimeError):
            store_messages.warn("a compiled entry could not be saved", entries.store().describe(), error)
        messages.left_out(frame, f"not saved ({error!s:.200})")
        entries.LEASES.release(ours.key.digest)
        return False
    entries.LEASES.release(ours.key.digest)
    messages.saved()
    STATE.saved_here.add(ours.key.digest)
    return True


def _entry_bytes(entry: Any) -> bytes:
    """A package's entry with its backends, pickled as ``DynamoStore.save_cache_entry``
    would write it.  Our store only: torch's mega-cache (``save_cache_artifacts``)
    records what the user's settings make torch save, and these entries are ours."""
    import pickle

    from torch._dynamo.package import PrecompileCacheEntry
    from torch._dynamo.precompile_context import PrecompileContext
    from torch.compiler._cache import CacheArtifactManager

    with CacheArtifactManager.with_fresh_cache():
        backends = {bid: PrecompileContext.serialize_artifact_by_key(bid) for bid in entry.backend_ids}
        try:
            return pickle.dumps(PrecompileCacheEntry(entry, backends))
        except Exception as error:
            raise RuntimeError(f"Failed to pickle the entry: {error}") from error


def _record_artifact(call: Any, cls: Any, artifact: Any) -> None:
    """A graph's compiled artifact arrived (a backward, compiled on first use): save the
    packages that waited for one.  One compiled with flat inputs is recorded with what
    flattens them (``bundling.flat_inputs``)."""
    call(cls, bundling.flat_inputs(artifact))
    with EVENTS.timed("warm start save"):
        for package, ours in list(STATE.ours.items()):
            if ours.pending is not None and package.current_entry is None:  # one being compiled: when it ends
                _save(package, ours, ours.pending.frame)
        for record in list(STATE.orphans):  # their packages are gone: their last entries
            if _written(record.entry, record.ours, record.frame) is not None:
                STATE.orphans.remove(record)


def _bypass_package(call: Any, self: Any, reason: str = "", **kwargs: Any) -> None:
    """A compile left out of one of our packages: named in explain() rather than in torch's
    warning, and never an error (``strict_precompile`` is about the user's packages)."""
    frame = STATE.compiling.get().frame
    if frame is None or self.package is None or self.package not in STATE.ours:
        return call(self, reason, **kwargs)
    traced = STATE.compiling.get().traced
    if reason == graph_params.STATIC_ADDRESSES and traced is not None and graph_params.rebindable(self):
        return None  # kept: its tensors are bound in another process (graph_params.record)
    messages.left_out(frame, reason)
    self.package.bypass_current_compile()
    self.package = None


HOOKS = [
    Hook("torch._dynamo.output_graph", "OutputGraph.bypass_package", "warm_start", _bypass_package,
         params=("reason",)),
    Hook("torch._dynamo.precompile_context", "PrecompileContext.record_artifact", "warm_start", _record_artifact,
         params=("artifact",)),
]
