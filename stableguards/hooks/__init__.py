"""The hook layer: how stableguards meets torch's private internals.

Each feature's ``hooks`` module (``stableguards.<feature>.hooks``) declares
its seams in a table (``HOOKS``); a seam several features need is owned by
``hooks.seams``, which runs their steps.  ``install`` applies the tables
all-or-nothing per part, with feature detection (the hook point exists, the
parameters a hook binds by name are there), and every hook runs through one
fail-open wrapper (``hooks.core``).  The layer's own state (installed seams,
releases waiting for a safe point) lives on ``STATE`` (``hooks.state``).

Nothing here imports ``torch._dynamo`` eagerly.  ``arm()`` runs at the end of
``import torch`` (through the ``torch.backends`` entry point) and on
``import stableguards``; it waits for ``torch._dynamo`` to be imported, so a
program that never compiles pays only for this package's import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from stableguards import registry
from stableguards.events import EVENTS
from stableguards.hooks import operators
from stableguards.hooks.core import FLAG, Hook, HookDoesNotFit, Needs, apply, enabled, needs, remove, remove_all
from stableguards.hooks.state import STATE, mid_import

log = logging.getLogger("stableguards")

__all__ = ["ENV_VAR", "FLAG", "SHARED", "STATE", "arm", "enabled", "hook_tables", "install", "uninstall"]

ENV_VAR = "TORCHDYNAMO_STABLE_GUARDS"
# torch releases whose hook points this layer was tested against; another one gets
# a warning and no hooks unless the user opts in with UNTESTED_ENV_VAR.
TESTED_TORCH = ("2.13", "2.14", "2.15")
UNTESTED_ENV_VAR = "STABLEGUARDS_UNTESTED_TORCH"
LOG_ARTIFACT = "stableguards"
# The table of the shared seams' owners (hooks.seams): installed first, or nothing is.
SHARED = "shared"
# The recorders' table (hooks.operators): in place from the end of ``import torch`` on.
RECORDING = "recording"


def hook_tables() -> dict[str, list[Hook]]:
    """Every declared hook: the shared seams' owners, then each part's, in the registry's order.
    Importing the parts' hook modules fills the shared slots: each must be filled."""
    from stableguards.hooks import seams

    tables = {SHARED: seams.HOOKS, RECORDING: operators.HOOKS,
              **{part: registry.module(part, "hooks").HOOKS for part in registry.PARTS}}
    seams.check_slots()
    return tables


def hook_table() -> str:
    """Every seam stableguards hooks, as a markdown table (``python -m stableguards hooks``;
    docs/hooks.md holds its output): where, which part, and what the hook does there; then
    the shared slots, with the parts that fill each in the order they run."""
    from stableguards.hooks import seams

    rows = ["| torch seam | part | what the hook does |", "|---|---|---|"]
    for part, hooks in hook_tables().items():
        for hook in hooks:
            where = f"`{hook.module}.{hook.target}`" + (" (lazy)" if hook.lazy else "")
            rows.append(f"| {where} | {'shared' if part == SHARED else part} | {_summary(hook.impl)} |")
    rows += ["", "| slot | when | parts, in order (step) |", "|---|---|---|"]
    for slot in seams.SLOTS:
        filled = ", ".join(f"{step.part} (`{step.name}`)" for step in seams.steps(slot.name))
        rows.append(f"| `{slot.name}` | {slot.when} | {filled} |")
    return "\n".join(rows)


def _summary(fn: Callable[..., Any]) -> str:
    """The first sentence of a hook's docstring, on one line, cut at its first colon."""
    doc = " ".join((inspect.getdoc(fn) or "").split())
    return doc.split(". ")[0].split(": ")[0].rstrip(".").replace("|", "\\|")


def arm() -> None:
    """Register the flag and hooks as soon as ``torch._dynamo`` exists.

    Called at the end of ``import torch``, where an exception would abort the
    import, so it never raises.
    """
    try:
        _register_log_artifact()
        _install_recorders()
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and hasattr(dynamo, "config"):
            install()
        elif not any(isinstance(f, _AfterImport) and f.module_name == "torch._dynamo" for f in sys.meta_path):
            _after_import("torch._dynamo", lambda _: install())
    except Exception as error:  # noqa: BLE001 - must not break `import torch`
        uninstall()
        EVENTS.warn_once("arm", f"stableguards could not arm its hooks ({error!r}); it is inactive")


def install() -> None:
    """Register the flag and put every part's hooks in place (idempotent)."""
    import torch
    import torch._dynamo.config as dynamo_config

    _register_flag(dynamo_config)
    if registry.UNKNOWN_DISABLED:
        EVENTS.warn_once("parts", f"{registry.DISABLE_ENV_VAR} names "
                                  f"{', '.join(sorted(registry.UNKNOWN_DISABLED))}, which stableguards does "
                                  f"not have; its parts are {', '.join(registry.PARTS)}")
    release = ".".join(torch.__version__.split(".")[:2])
    if release not in TESTED_TORCH and not os.environ.get(UNTESTED_ENV_VAR):
        EVENTS.warn_once("version", f"stableguards is tested with torch {', '.join(TESTED_TORCH)}, not "
                                    f"{torch.__version__}: torch._dynamo.config.{FLAG} is accepted but "
                                    f"does nothing (set {UNTESTED_ENV_VAR}=1 to try its hooks anyway)")
        return
    tables = hook_tables()
    _install_recorders()
    if SHARED not in STATE.installed:
        _install_part(SHARED, tables[SHARED])
        if SHARED not in STATE.installed:
            return
    for part, hooks in tables.items():
        if part not in STATE.installed:
            _install_part(part, hooks)
    _attach_log_artifact()
    _skip_in_dynamo()


def _install_recorders() -> None:
    """The recorders (``Hook.records``), as early as ``import torch`` ends: before any user code
    can register what they record."""
    import torch

    if RECORDING in STATE.installed or ".".join(torch.__version__.split(".")[:2]) not in TESTED_TORCH \
            and not os.environ.get(UNTESTED_ENV_VAR):
        return
    _install_part(RECORDING, operators.HOOKS)


def _skip_in_dynamo() -> None:
    """Dynamo never traces stableguards' own code: a hook called while a compiled region
    runs (compiled autograd calls torch.compile) is skipped, as torch's own files are."""
    from torch._dynamo import trace_rules

    if not any(d.startswith(os.path.dirname(os.path.dirname(__file__))) for d in trace_rules.SKIP_DIRS):
        trace_rules.add(__name__.split(".")[0])


def _install_part(part: str, hooks: list[Hook]) -> None:
    try:
        needs(_needed(part))
        apply(h for h in hooks if not h.lazy)
    except HookDoesNotFit as why:
        _part_off(part, why)
        return
    STATE.installed.add(part)
    for module in dict.fromkeys(h.module for h in hooks if h.lazy):
        later = [h for h in hooks if h.lazy and h.module == module]
        _after_import(module, lambda _, part=part, later=later: _install_later(part, later))


def _needed(part: str) -> tuple[Needs, ...]:
    """What a part needs of torch without hooking it (``NEEDS`` in its hooks module)."""
    hooks = registry.module(part, "hooks") if part in registry.PARTS else None
    return getattr(hooks, "NEEDS", ())


def _install_later(part: str, hooks: list[Hook]) -> None:
    """Hooks of a part whose module loaded after the rest went in: all of them, or the part goes."""
    if part not in STATE.installed:
        return
    try:
        apply(hooks)
    except HookDoesNotFit as why:
        remove(part)
        _part_off(part, why)


def _part_off(part: str, why: Exception) -> None:
    if part == RECORDING:
        log.info(f"stableguards records no custom operator kernels: {why}; graphs calling custom operators "
                 f"are left out of warm start")
        return
    if part == SHARED:
        EVENTS.warn_once("shared seams", f"stableguards is inactive: the seams its parts share do not fit "
                                         f"this torch ({why})")
        return
    message = (f"stableguards part {part!r} stays off: its hook points do not fit this torch ({why}); "
               f"the other parts work as usual")
    if registry.feature(part).newest_torch_only:
        log.info(message)  # expected on older torch: not worth a warning on every run
    else:
        EVENTS.warn_once(f"part {part}", message)


def uninstall() -> None:
    """Put every original back; the flag stays registered so user code keeps working."""
    remove_all()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


def _register_flag(dynamo_config: ModuleType) -> None:
    from torch.utils._config_module import _Config, _ConfigEntry

    if FLAG in dynamo_config._config:
        return
    config = _Config(default=False, env_name_default=ENV_VAR)
    # Feature detection: torch 2.13+ passes the entry its name; older ones do not.
    takes_name = len(inspect.signature(_ConfigEntry.__init__).parameters) > 2
    entry = _ConfigEntry(config, FLAG) if takes_name else _ConfigEntry(config)
    dynamo_config._config[FLAG] = entry
    # The module caches its hash (and, from 2.13, its dict) per context; both must see the new key.
    if hasattr(dynamo_config, "_hash_dirty_var"):
        dynamo_config._hash_dirty_var.set(True)
        dynamo_config._get_dict_dirty_keys_var.set(None)
    else:
        dynamo_config._is_dirty = True


def _register_log_artifact() -> None:
    """TORCH_LOGS=stableguards: torch parses TORCH_LOGS right after loading entry points."""
    from torch._logging._internal import log_registry, register_artifact

    if not log_registry.is_artifact(LOG_ARTIFACT):
        register_artifact(LOG_ARTIFACT, "stableguards: why restarts missed and frames recompiled",
                          off_by_default=True)


def _attach_log_artifact() -> None:
    import torch._logging

    logger = torch._logging.getArtifactLogger("torch._dynamo.stableguards", LOG_ARTIFACT)
    if not EVENTS.listeners:
        EVENTS.listeners.append(logger.debug)


def _after_import(module_name: str, install_hooks: Callable[[ModuleType], None]) -> None:
    """Run ``install_hooks`` on the module now if it is loaded, else once it is."""
    module = sys.modules.get(module_name)
    if module is not None:
        if mid_import(module):
            STATE.install_after_import(module_name, install_hooks)  # past the import finder already
        else:
            install_hooks(module)
        return
    waiting = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.module_name == module_name),
                   None)
    if waiting is None:
        waiting = _AfterImport(module_name)
        sys.meta_path.insert(0, waiting)
    waiting.callbacks.append(install_hooks)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run callbacks right after a module finishes importing, then step aside."""

    def __init__(self, module_name: str) -> None:
        self.module_name = module_name
        self.callbacks: list[Callable[[ModuleType], None]] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callbacks = self.callbacks

        def exec_then_callback(module: ModuleType) -> None:
            exec_module(module)
            try:
                for callback in callbacks:
                    callback(module)
            except Exception as error:  # noqa: BLE001 - never break the user's import
                uninstall()  # an unexpected failure: all hooks or none
                EVENTS.warn_once("install", f"stableguards could not install ({error!r}); it is inactive")

        spec.loader.exec_module = exec_then_callback  # type: ignore[method-assign]
        return spec
