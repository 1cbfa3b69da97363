"""Saved entries read back for the audit (``warm_start.audit``): their proofs, without running
anything and without importing the user's modules.

An entry's guard state names the user's objects by reference (modules, classes,
functions); loading it for real imports them.  The audit only needs the proof
saved beside them (plain tuples), so what the state names outside torch, the
standard library and stableguards is loaded as an inert stand-in.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

from stableguards.components import Components
from stableguards.storage import ContentStore
from stableguards.warm_start.entries import fetch
from stableguards.warm_start.proof import Proof

# Loaded for real: what torch's and Python's own pickles name.  Anything else (the user's
# modules, and the helpers that find the user's objects by path) is a stand-in.
_REAL = frozenset({"torch", "builtins", "copyreg", "collections", "_codecs", "functools", "types", "enum",
                   "typing", "dataclasses", "weakref", "operator", "math", "stableguards"})
_FINDS_USER_OBJECTS = frozenset({("stableguards.codes", "code_at"), ("stableguards.identity.fx_home", "class_at")})


def saved_proofs(index: Path, store: ContentStore) -> list[tuple[str, list[Proof | None]]]:
    """For each function the index names (its last saved key), its entry's proofs, one per
    compile: (a name for the entry, proofs)."""
    found = []
    for path in sorted(index.glob("*.json")):
        try:
            key = Components.from_json(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        parts = dict(key.items)
        name = f"{parts.get('module')}.{parts.get('qualname')} ({parts.get('file')}), key {key.digest[:12]}"
        try:
            data = fetch(store, key.digest)
        except Exception as error:  # noqa: BLE001 - an unreachable store, a corrupt or unsigned entry
            found.append((f"{name}: unreadable ({error!s:.120})", []))
            continue
        if data is None:
            found.append((f"{name}: not in {store.describe()}", []))
            continue
        entry = pickle.loads(data)  # noqa: S301 - verified (digest, and the HMAC with a key) by the store
        found.append((name, [_proof(guarded.guards_state) for code in entry.dynamo.codes
                             for guarded in code.guarded_codes]))
    return found


def _proof(guards_state: bytes) -> Proof | None:
    try:
        state = _inert_loader()(guards_state)
    except Exception:  # noqa: BLE001 - a state this reader cannot load: no proof shown
        return None
    return Proof.from_state(getattr(state, "stableguards_proof", None))


def _inert_loader() -> Any:
    import io

    from torch._dynamo.package import _GuardsStateUnpickler

    class Inert(_GuardsStateUnpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in _FINDS_USER_OBJECTS or module == "__main__" or (
                    module.partition(".")[0] not in _REAL and module not in sys.modules):
                return _stand_in(module, name)
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):  # what another version or process named
                return _stand_in(module, name)

    return lambda data: Inert(io.BytesIO(data)).load()


def _stand_in(module: str, name: str) -> type:
    """A class standing for ``module.name``: made, called and given state, it does nothing."""

    class StandIn:
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            return object.__new__(cls)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self

        def __setstate__(self, state: Any) -> None:
            pass

    StandIn.__module__, StandIn.__qualname__ = module, name
    return StandIn
