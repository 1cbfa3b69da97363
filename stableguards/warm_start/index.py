"""The last saved key of each function, so that a later miss can name what changed.

One small file per function (its module, qualname and receiver class; a lambda's
first line too, since lambdas share a qualname), holding the key's components.
A warm process whose key finds no entry reads the file and diffs the two keys
component by component (``Components.differences``).
"""

from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path

from stableguards.components import Components
from stableguards.files import atomic_write


def function_name(key: Components, code: types.CodeType) -> str:
    """The index's name for the function ``key`` is for."""
    parts = dict(key.items)
    name = f"{parts['module']}:{parts['qualname']}:{parts['receiver']}"
    if "<lambda>" in parts["qualname"]:
        name += f":{code.co_firstlineno}"
    return hashlib.sha256(name.encode()).hexdigest()[:32]


def index_path(directory: Path, key: Components, code: types.CodeType) -> Path:
    return directory / f"{function_name(key, code)}.json"


def record(key: Components) -> bytes:
    """What the index holds for a function: its last saved key's components."""
    return json.dumps(key.as_json()).encode()


def write_index(directory: Path, key: Components, code: types.CodeType) -> None:
    path = index_path(directory, key, code)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, record(key))


def saved_key(raw: bytes) -> Components | None:
    """The key a record holds; None for one that does not parse."""
    try:
        return Components.from_json(json.loads(raw))
    except ValueError:
        return None


def differences(key: Components, saved: Components | None) -> list[str] | None:
    """How ``key`` differs from ``saved``; None when nothing was saved or the keys are equal."""
    return key.differences(saved) if saved is not None and saved.digest != key.digest else None


def changed_components(directory: Path, key: Components, code: types.CodeType) -> list[str] | None:
    """How ``key`` differs from the last key saved for the same function on this machine; None
    when nothing was saved for it (a cold start: nothing to explain) or the keys are equal."""
    try:
        raw = index_path(directory, key, code).read_bytes()
    except OSError:
        return None
    return differences(key, saved_key(raw))
