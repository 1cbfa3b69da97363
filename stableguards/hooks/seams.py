"""The torch seams several features need, and the signals parts send each other: named slots.

Each shared seam is patched once, here.  Its hook computes what the features need
from it, once, and runs the steps parts put in its slots, in the slot's fixed order
(``SLOTS``), each only while its part is active and each failing open on its own
(``core.run_step``).  A part fills a slot at import (``@fills(slot, part)``); a slot a
part is listed for and did not fill fails at install (``check_slots``), never at run time.

Torch seams:

* ``ConvertFrameAssert.__call__``, a frame starts compiling: what the compile
  is for (``Compile``: the frame's label, the backend's key and compiler name,
  found in one walk along the backend chain), read by every feature through
  ``current()``.  Slots ``convert_frame.start`` and ``convert_frame.compile``.
  Also a safe point for releases waiting on a compile.
* ``compute_cache_size``: slot ``cache_size.count``.
* ``DynamoOutput.build_guards``: slots ``build_guards.before`` and ``build_guards.after``.
* ``OptimizerVariable.map_sources_and_install_guards``: slot ``optimizer_sources.after``.

Signals between parts (no part imports another's package): ``graph.declined``,
``graph.runs_untraced`` and ``entry.lives_with``, sent with ``signal``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any, TypeVar

from stableguards.codes import frame_label
from stableguards.hooks.core import Hook, HookDoesNotFit, registered_name, run_step
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
class Slot:
    """A named place where parts put a step: when it runs, and the parts that fill it, in the
    order they run."""

    name: str
    when: str
    order: tuple[str, ...]


SLOTS = (
    Slot("convert_frame.start", "a frame starts compiling: told what it is compiled for", ("backends",)),
    Slot("convert_frame.compile", "compiles the frame itself and returns the result, or returns None",
         ("warm_start",)),
    Slot("cache_size.count", "returns the cache entries that count towards the recompile limit",
         ("optimizers", "backends")),
    Slot("build_guards.before", "a frame's guards are about to be built", ("optimizers",)),
    Slot("build_guards.after", "a frame's guards are built", ("profiles", "optimizers")),
    Slot("optimizer_sources.after", "Dynamo mapped an optimizer's sources", ("optimizers", "cudagraphs")),
    Slot("graph.declined", "a part declines to let the graph being compiled be cached (why)", ("warm_start",)),
    Slot("graph.runs_untraced", "the graph being compiled runs functions Dynamo never traced",
         ("warm_start",)),
    Slot("entry.lives_with", "an entry installed without a trace lives as long as these objects",
         ("optimizers",)),
)
_SLOTS = {slot.name: slot for slot in SLOTS}


@dataclass(frozen=True)
class Step:
    """A part's step in a slot: its function, named for warnings."""

    slot: str
    part: str
    name: str
    fn: Callable[..., Any]


# slot -> part -> its step, as filled at import.
FILLED: dict[str, dict[str, Step]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def fills(slot: str, part: str) -> Callable[[F], F]:
    """Put the decorated function in ``slot`` as ``part``'s step."""
    if part not in _SLOTS[slot].order:
        raise ValueError(f"{part} is not listed in slot {slot}")

    def register(fn: F) -> F:
        FILLED.setdefault(slot, {})[part] = Step(slot, part, fn.__name__, fn)
        return fn

    return register


def check_slots() -> None:
    """Every slot has a step from each part listed for it (install: a renamed or missing step
    fails here, not as a fallback when a compile reaches it)."""
    missing = [f"{slot.name} ({part})" for slot in SLOTS for part in slot.order
               if part not in FILLED.get(slot.name, {})]
    if missing:
        raise HookDoesNotFit(f"no step fills {', '.join(missing)}")


def steps(slot: str) -> list[Step]:
    """``slot``'s steps, in its order."""
    filled = FILLED.get(slot, {})
    return [filled[part] for part in _SLOTS[slot].order if part in filled]


def signal(slot: str, *args: Any) -> None:
    """Tell the parts in ``slot`` (each only while it is active, each failing open)."""
    for step in steps(slot):
        run_step(step, *args)


def _convert_frame(call: Any, self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """A frame starts compiling: what it is compiled for, for every feature; a backend switch
    said; the frame compiled for warm start's saved entry.  Also a safe point for releases."""
    STATE.release_pending()
    key, compiler = _backend_chain(self)
    token = _CURRENT.set(Compile(frame.f_code, frame_label(frame.f_code), key, compiler))
    try:
        signal("convert_frame.start", current())
        # Warm start compiles the frame itself (its package, a retry without it), or nothing runs.
        for step in steps("convert_frame.compile"):
            compiled = run_step(step, call, self, frame, *args, **kwargs)
            if compiled is not None:
                return compiled
        return call.result if call.done else call(self, frame, *args, **kwargs)
    finally:
        _CURRENT.reset(token)


def _backend_chain(convert: Any) -> tuple[Any, str | None]:
    """The BackendKey at the end of the backend chain (if any), and the innermost
    ``compiler_name`` along it, else the registered name of its end."""
    from stableguards.fingerprint import BackendKey

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
    for step in steps("cache_size.count"):
        counted = run_step(step, cache_entries, current())
        cache_entries = cache_entries if counted is None else counted
    return call(frame, cache_entries, *args)


def _build_guards(call: Any, self: Any, code: Any, *args: Any, **kwargs: Any) -> Any:
    """A frame's guards are built: optimizer state guards replaced before; the compile's
    outcomes recorded in the profile and the entry tied to its optimizers after."""
    signal("build_guards.before", self)
    check_fn = call(self, code, *args, **kwargs)
    signal("build_guards.after", self, code, check_fn)
    return check_fn


def _map_sources_and_install_guards(call: Any, self: Any, tx: Any) -> None:
    """Dynamo mapped an optimizer's sources: its state dicts noted, its copied grads named."""
    call(self, tx)
    signal("optimizer_sources.after", self, tx)


HOOKS = [
    Hook(_CONVERT_FRAME, "ConvertFrameAssert.__call__", None, _convert_frame, params=("frame",)),
    # convert_frame imported it by name: its copy is the one called.
    Hook(_CONVERT_FRAME, "compute_cache_size", None, _compute_cache_size, params=("frame", "cache_entries")),
    Hook(_CONVERT_FRAME, "DynamoOutput.build_guards", None, _build_guards, params=("code",)),
    Hook("torch._dynamo.variables.optimizer", "OptimizerVariable.map_sources_and_install_guards", None,
         _map_sources_and_install_guards, params=("tx",)),
]
