"""The one module that touches torch's private internals.

It registers the ``torch._dynamo.config.stable_guards`` flag, installs and
uninstalls every hook, and refuses to hook a torch it was not written for.
Every hook reads the flag on each call, so flipping it takes effect at the next
compile, and every hook fails open: an error inside stableguards logs one
warning, is counted by the manager, and the call goes to torch's own code.

Nothing here imports ``torch._dynamo`` eagerly.  ``arm()`` runs at the end of
``import torch`` (through the ``torch.backends`` entry point) and on
``import stableguards``; it waits for ``torch._dynamo`` to be imported, so a
program that never compiles pays only for this module's import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from stableguards.manager import GuardManager

log = logging.getLogger("stableguards")

FLAG = "stable_guards"
ENV_VAR = "TORCHDYNAMO_STABLE_GUARDS"
SUPPORTED_TORCH = ("2.13.",)

MANAGER = GuardManager()

# (owner, attribute) -> the original, for every hook in place.
_originals: dict[tuple[Any, str], Any] = {}
_warned: set[str] = set()


def arm() -> None:
    """Register the flag and hooks as soon as ``torch._dynamo`` exists.

    Called at the end of ``import torch``, where an exception would abort the
    import, so it never raises.
    """
    try:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and hasattr(dynamo, "config"):
            install()
        elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport("torch._dynamo", lambda _: install()))
    except Exception as error:  # noqa: BLE001 - must not break `import torch`
        _warn_once("arm", f"stableguards could not arm its hooks ({error!r}); it is inactive")


def install() -> None:
    """Register the flag and put every hook in place (idempotent)."""
    import torch
    import torch._dynamo.config as dynamo_config

    _register_flag(dynamo_config)
    if not torch.__version__.startswith(SUPPORTED_TORCH):
        _warn_once(
            "version",
            f"stableguards supports torch {', '.join(v + 'x' for v in SUPPORTED_TORCH)}, "
            f"not {torch.__version__}: torch._dynamo.config.{FLAG} is accepted but does nothing",
        )
        return
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    _hook(ShapeEnv, "_generate_unique_id", _stable_unique_id)


def uninstall() -> None:
    """Put every original back; the flag stays registered so user code keeps working."""
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()


def enabled() -> bool:
    """Whether the flag is on for the current thread (config overrides are per thread)."""
    import torch._dynamo.config as dynamo_config

    return bool(getattr(dynamo_config, FLAG, False))


def _register_flag(dynamo_config: ModuleType) -> None:
    from torch.utils._config_module import _Config, _ConfigEntry

    if FLAG in dynamo_config._config:
        return
    entry = _ConfigEntry(_Config(default=False, env_name_default=ENV_VAR), FLAG)
    dynamo_config._config[FLAG] = entry
    # The module caches its hash and dict per context; both must see the new key.
    dynamo_config._hash_dirty_var.set(True)
    dynamo_config._get_dict_dirty_keys_var.set(None)


def _hook(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    if (owner, name) in _originals:
        return
    original = getattr(owner, name)
    _originals[(owner, name)] = original
    setattr(owner, name, make(original))


def _fell_back(hook: str, error: BaseException) -> None:
    MANAGER.record_fallback(hook, error)
    _warn_once(hook, f"stableguards hook {hook!r} failed ({error!r}); using torch's own behaviour")


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _stable_unique_id(original: Callable[[Any, str], int]) -> Callable[[Any, str], int]:
    def _generate_unique_id(shape_env: Any, source_name: str) -> int:
        if enabled():
            try:
                return MANAGER.symbol_id(shape_env, source_name, shape_env.unique_ids)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("symbol ids", error)
        return original(shape_env, source_name)

    return _generate_unique_id


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run a callback right after a module finishes importing, then step aside."""

    def __init__(self, module_name: str, callback: Callable[[ModuleType], None]) -> None:
        self.module_name = module_name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_callback(module: ModuleType) -> None:
            exec_module(module)
            try:
                callback(module)
            except Exception as error:  # noqa: BLE001 - never break the user's import
                _warn_once("install", f"stableguards could not install ({error!r}); it is inactive")

        spec.loader.exec_module = exec_then_callback  # type: ignore[method-assign]
        return spec
