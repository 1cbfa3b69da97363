"""How a hook is declared, wrapped and installed: the one place that patches torch.

Each feature's ``hooks`` module declares its seams in a table, ``HOOKS``: a
list of ``Hook`` (where, which part, what runs); a seam several features need
has one owner, ``stableguards.hooks.seams``, whose hooks belong to no part.  ``install`` applies the
tables all-or-nothing per part, after checking that every hook point exists
and that the parameters a hook binds by name are there (feature detection:
no version strings).  Every hook runs through ``_wrap``, which checks the flag
and the part first and fails open by construction:

* flag off, or the part left to torch: torch's own code, unchanged;
* an exception from torch's own code: re-raised as it is;
* an exception of stableguards' own: one warning, a counted fallback, and
  torch's result: the original's return value if it already ran, else a call
  to the original.

A hook's ``impl`` receives ``call``, the original wrapped so that the wrapper
knows whether torch has run or raised, followed by the original's arguments.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stableguards import registry
from stableguards.events import EVENTS
from stableguards.hooks.state import STATE

log = logging.getLogger("stableguards")

FLAG = "stable_guards"


class PassThrough(Exception):
    """An exception a part raises on purpose, to the user (cudagraphs' strict mode refusing
    to re-record): never a reason to fall back.  Parts subclass it; the core knows none of
    them."""


@dataclass(eq=False)  # compared by identity: a hook is one seam's one wrapper
class Hook:
    """One seam: ``module.target`` (``"Class.method"`` or a function) runs ``impl``.

    ``target`` may name a property: its getter is hooked.  ``part`` is the feature it
    belongs to; None for a shared seam's owner
    (``hooks.seams``), which runs while the flag is on and asks ``active`` for
    each feature it serves.

    ``params`` are the parameter names ``impl`` binds by name; install checks
    that the hook point has them.  ``lazy`` hook points live in a module that
    cannot be imported while ``torch._dynamo`` is importing (inductor): they go
    in when that module is loaded.
    """

    module: str
    target: str
    part: str | None
    impl: Callable[..., Any]
    params: tuple[str, ...] = ()
    lazy: bool = False
    # A recorder: it keeps what torch did and changes nothing, so it runs whatever the flag,
    # from the end of ``import torch`` on (torch keeps a custom operator's kernels where only
    # a registration seen happening can tell them).
    records: bool = False
    # Runs on every thread, whatever its flag: torch does the seam's work on its worker
    # threads, where a flag set with config.patch in the compiling thread is not seen.  Its
    # impl acts only on objects a hook of its part marked in the compiling thread.
    any_thread: bool = False

    @property
    def name(self) -> str:
        return f"{self.target} ({self.part or 'shared'})"


class HookDoesNotFit(Exception):
    """A hook point is missing or has another shape in this torch."""


class TorchError(Exception):
    """A hook raising one of torch's own exceptions on purpose (a PackageError that leaves a
    compile out of its package): the wrapper raises ``error`` as torch would, and does
    not fall back."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def enabled(part: str | None) -> bool:
    """Whether the flag is on for this thread (config overrides are per thread) and
    ``part`` is not listed in STABLEGUARDS_DISABLE."""
    import torch._dynamo.config as dynamo_config

    return bool(getattr(dynamo_config, FLAG, False)) and part not in registry.DISABLED


def active(part: str) -> bool:
    """Whether a shared seam's owner serves ``part`` now: enabled, and its hooks are in place."""
    return part in STATE.installed and enabled(part)


class _Original:
    """torch's function, called at most as the hook decides, remembering what happened."""

    __slots__ = ("fn", "done", "raised", "result")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.done, self.raised, self.result = fn, False, False, None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self.result = self.fn(*args, **kwargs)
        except BaseException:
            self.raised = True
            raise
        self.done = True
        return self.result


def _wrap(hook: Hook, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def hooked(*args: Any, **kwargs: Any) -> Any:
        if not hook.records and not hook.any_thread and not enabled(hook.part):
            return original(*args, **kwargs)
        call = _Original(original)
        try:
            return hook.impl(call, *args, **kwargs)
        except PassThrough:
            raise
        except TorchError as deliberate:
            raise deliberate.error from None
        except Exception as error:
            if call.raised or _restarts(error):
                raise  # torch's own exception, unchanged; or a deliberate restart
            EVENTS.fell_back(hook.name, error)
            return call.result if call.done else original(*args, **kwargs)

    hooked.__stableguards_hook__ = hook  # type: ignore[attr-defined]
    return hooked


def run_step(step: Any, *args: Any, **kwargs: Any) -> Any:
    """A feature's step at a shared seam (``hooks.seams``): run while its part is active; None
    when it is not, or when it failed, which fails open as a hook does (one warning, a
    counted fallback).  An exception torch raised inside it (an ``_Original`` among the
    arguments that raised) or a deliberate one passes through."""
    if not active(step.part):
        return None
    try:
        return step.fn(*args, **kwargs)
    except PassThrough:
        raise
    except TorchError as deliberate:
        raise deliberate.error from None
    except Exception as error:
        if _restarts(error) or any(isinstance(a, _Original) and a.raised for a in args):
            raise
        EVENTS.fell_back(f"{step.name} ({step.part})", error)
        return None


def _restarts(error: Exception) -> bool:
    """A hook may ask Dynamo to analyse the frame again (torch's RestartAnalysis, e.g. to
    specialize a float): control flow, not a failure to fall back from."""
    exc = sys.modules.get("torch._dynamo.exc")
    return exc is not None and isinstance(error, exc.RestartAnalysis)


@dataclass(frozen=True)
class Needs:
    """Something of torch a part needs without hooking it (feature detection): looked up at
    install like a hook point, never patched; a part whose needs are missing stays off."""

    module: str
    target: str
    params: tuple[str, ...] = ()


def needs(found: Iterable[Needs]) -> None:
    """Raise HookDoesNotFit unless each of ``found`` is in this torch."""
    for need in found:
        _resolve(need)


def _resolve(hook: Hook | Needs) -> tuple[Any, str]:
    """The object that owns the hook point, and the attribute's name."""
    try:
        owner: Any = importlib.import_module(hook.module)
    except ImportError as error:
        raise HookDoesNotFit(f"{hook.module} cannot be imported ({error})") from None
    *path, attr = hook.target.split(".")
    for name in path:
        owner = getattr(owner, name, None)
        if owner is None:
            raise HookDoesNotFit(f"{hook.module}.{hook.target}: {name} is missing")
    raw = inspect.getattr_static(owner, attr, None)
    if not callable(getattr(owner, attr, None)) and not isinstance(raw, property):
        raise HookDoesNotFit(f"{hook.module}.{hook.target} is missing")
    if hook.params:
        try:
            params = inspect.signature(raw.fget if isinstance(raw, property) else getattr(owner, attr)).parameters
        except (TypeError, ValueError):
            params = {}
        if missing := [p for p in hook.params if p not in params]:
            raise HookDoesNotFit(f"{hook.module}.{hook.target} has no parameter {', '.join(missing)}")
    return owner, attr


@dataclass
class _Seam:
    """A patched attribute: torch's original and the hooks stacked on it, in install order."""

    raw: Any  # as found on the owner (a staticmethod or classmethod stays one)
    hooks: list[Hook]


def _compose(owner: Any, attr: str, seam: _Seam) -> None:
    if isinstance(seam.raw, property):  # a property's getter is the hook point
        fn = seam.raw.fget
        for hook in seam.hooks:
            fn = _wrap(hook, fn)
        setattr(owner, attr, seam.raw.getter(fn))
        return
    kind = type(seam.raw) if isinstance(seam.raw, (staticmethod, classmethod)) else None
    fn = seam.raw.__func__ if kind is not None else seam.raw
    for hook in seam.hooks:
        fn = _wrap(hook, fn)
    setattr(owner, attr, kind(fn) if kind is not None else fn)


def apply(hooks: Iterable[Hook]) -> None:
    """Install hooks of one part, all or none: if one does not fit, none stays."""
    hooks = list(hooks)
    resolved = [(_resolve(h), h) for h in hooks]  # raises HookDoesNotFit before any change
    for (owner, attr), hook in resolved:
        seam = STATE.seams.get((owner, attr))
        if seam is None:
            seam = STATE.seams[(owner, attr)] = _Seam(inspect.getattr_static(owner, attr), [])
        if hook not in seam.hooks:
            seam.hooks.append(hook)
            _compose(owner, attr, seam)


def remove(part: str) -> None:
    """Take every hook of ``part`` out; seams with no hook left get torch's original back."""
    for (owner, attr), seam in list(STATE.seams.items()):
        kept = [h for h in seam.hooks if h.part != part]
        if len(kept) == len(seam.hooks):
            continue
        seam.hooks = kept
        if kept:
            _compose(owner, attr, seam)
        else:
            setattr(owner, attr, seam.raw)
            del STATE.seams[(owner, attr)]
    STATE.installed.discard(part)


def remove_all() -> None:
    for (owner, attr), seam in STATE.seams.items():
        setattr(owner, attr, seam.raw)
    STATE.seams.clear()
    STATE.installed.clear()


def installed_hooks() -> list[Hook]:
    """Every hook in place now, in install order per seam."""
    return [hook for seam in STATE.seams.values() for hook in seam.hooks]


def cache_subdir(name: str) -> Path:
    """``<inductor cache dir>/stableguards/<name>``: where stableguards keeps its files."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "stableguards" / name


def registered_name(obj: Any) -> str | None:
    """The name ``obj`` is registered under as a Dynamo backend, by identity."""
    from torch._dynamo.backends import registry

    for name, fn in registry._COMPILER_FNS.items():
        if fn is obj:
            return name
    return None
