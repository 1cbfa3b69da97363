"""The torch seams several features need: one hook each, owned here.

Each shared seam is patched once.  Its hook computes what the features need
from it, once, and runs their steps in a fixed order (``STEPS``), each only
while its part is active and each failing open on its own (``core.run_step``):

* ``ConvertFrameAssert.__call__``, a frame starts compiling: what the compile
  is for (``Compile``: the frame's label, the backend's key and compiler name,
  found in one walk along the backend chain), read by every feature through
  ``current()``; backends say when a frame switched backends; warm start
  compiles the frame for its saved entry (and again without its machinery if
  that fails).  Also a safe point for releases waiting on a compile.
* ``compute_cache_size``: which cache entries count towards the recompile limit.
* ``DynamoOutput.build_guards``: optimizers replace state guards before, and
  tie the entry to its optimizers after; profiles record the outcomes after.
* ``OptimizerVariable.map_sources_and_install_guards``: optimizers note the
  state dicts a step reads; cudagraphs say which grads they will copy.
"""

from __future__ import annotations

import contextvars
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any

from stableguards.codes import frame_label
from stableguards.hooks.core import Hook, registered_name, run_step
from stableguards.hooks.state import STATE

_CONVERT_FRAME = "torch._dynamo.convert_frame"


@dataclass(frozen=True)
class Compile:
    """What the frame being compiled is compiled for."""

    code: CodeType
    label: str
    backend_key: Any  # the interned BackendKey at the end of the backend chain (backends), if any
    compiler_name: str | None  # the innermost compiler_name along the chain, else the registered name


_CURRENT: contextvars.ContextVar[Compile | None] = contextvars.ContextVar("stableguards_compile", default=None)


def current() -> Compile | None:
    """The compile under way on this thread, while the flag is on."""
    return _CURRENT.get()


@dataclass(frozen=True)
class Step:
    """A feature's work at a shared seam: ``module.name``, run by the seam's hook.  Looked up
    when it runs, so it reads as any function of its feature."""

    seam: str
    part: str
    module: str
    name: str

    @property
    def fn(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.module), self.name)


_BACKENDS, _OPTIMIZERS = "stableguards.backends.hooks", "stableguards.optimizers.hooks"
# In the order they run at each seam.
STEPS = (
    Step("ConvertFrameAssert.__call__", "backends", _BACKENDS, "note_switch"),
    Step("ConvertFrameAssert.__call__", "warm_start", "stableguards.warm_start.hooks", "compile_frame"),
    Step("compute_cache_size", "optimizers", _OPTIMIZERS, "live_entries"),
    Step("compute_cache_size", "backends", _BACKENDS, "own_entries"),
    Step("DynamoOutput.build_guards", "optimizers", _OPTIMIZERS, "before_guards"),
    Step("DynamoOutput.build_guards", "profiles", "stableguards.profiles.hooks", "after_guards"),
    Step("DynamoOutput.build_guards", "optimizers", _OPTIMIZERS, "after_guards"),
    Step("OptimizerVariable.map_sources_and_install_guards", "optimizers", _OPTIMIZERS, "note_state_dicts"),
    Step("OptimizerVariable.map_sources_and_install_guards", "cudagraphs", "stableguards.cudagraphs.hooks",
         "warn_copied_grads"),
)


def _steps(seam: str) -> list[Step]:
    return [step for step in STEPS if step.seam == seam]


def _convert_frame(call: Any, self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """A frame starts compiling: what it is compiled for, for every feature; a backend switch
    said; the frame compiled for warm start's saved entry.  Also a safe point for releases."""
    STATE.release_pending()
    key, compiler = _backend_chain(self)
    token = _CURRENT.set(Compile(frame.f_code, frame_label(frame.f_code), key, compiler))
    try:
        note_switch, compile_frame = _steps("ConvertFrameAssert.__call__")
        run_step(note_switch, current())
        # Warm start compiles the frame itself (its package, a retry without it), or nothing runs.
        compiled = run_step(compile_frame, call, self, frame, *args, **kwargs)
        if compiled is not None:
            return compiled
        return call.result if call.done else call(self, frame, *args, **kwargs)
    finally:
        _CURRENT.reset(token)


def _backend_chain(convert: Any) -> tuple[Any, str | None]:
    """The BackendKey at the end of the backend chain (if any), and the innermost
    ``compiler_name`` along it, else the registered name of its end."""
    from stableguards.backends.fingerprint import BackendKey

    obj, name = convert, None
    for _ in range(16):  # the chain is short; a loop here would be a bug elsewhere
        if isinstance(candidate := getattr(obj, "compiler_name", None), str):
            name = candidate
        if isinstance(obj, BackendKey):
            return obj, name
        following = getattr(obj, "_torchdynamo_orig_backend", None)
        if following is None:
            break
        obj = following
    return None, name or registered_name(obj)


def _compute_cache_size(call: Any, frame: Any, cache_entries: Any, *args: Any) -> Any:
    """The recompile limit counts the entries the features say can still run for this compile."""
    for step in _steps("compute_cache_size"):
        counted = run_step(step, cache_entries, current())
        cache_entries = cache_entries if counted is None else counted
    return call(frame, cache_entries, *args)


def _build_guards(call: Any, self: Any, code: Any, *args: Any, **kwargs: Any) -> Any:
    """A frame's guards are built: optimizer state guards replaced before; the compile's
    outcomes recorded in the profile and the entry tied to its optimizers after."""
    before, record, tie = _steps("DynamoOutput.build_guards")
    run_step(before, self)
    check_fn = call(self, code, *args, **kwargs)
    run_step(record, code, self.tracer_output)
    run_step(tie, self, check_fn)
    return check_fn


def _map_sources_and_install_guards(call: Any, self: Any, tx: Any) -> None:
    """Dynamo mapped an optimizer's sources: its state dicts noted, its copied grads named."""
    call(self, tx)
    for step in _steps("OptimizerVariable.map_sources_and_install_guards"):
        run_step(step, self, tx)


HOOKS = [
    Hook(_CONVERT_FRAME, "ConvertFrameAssert.__call__", None, _convert_frame, params=("frame",)),
    # convert_frame imported it by name: its copy is the one called.
    Hook(_CONVERT_FRAME, "compute_cache_size", None, _compute_cache_size, params=("frame", "cache_entries")),
    Hook(_CONVERT_FRAME, "DynamoOutput.build_guards", None, _build_guards, params=("code",)),
    Hook("torch._dynamo.variables.optimizer", "OptimizerVariable.map_sources_and_install_guards", None,
         _map_sources_and_install_guards, params=("tx",)),
]
