"""Entries kept per rank: one per answer to the calls a compile folded about its process.

Dynamo folds ``dist.get_rank()``, ``dist.get_world_size()``, a process group's
ranks and whether a device is there into the graph as constants, without a
guard.  Each such call is a fact of the entry (``CONSTANT_RESULT``, checked
before the entry serves), so rank 1 is never served what rank 0 traced; and so
that every rank still starts warm from one shared store, an entry that folded
such calls is stored once per answer: the calls are stored under the entry's
key, and the entry under the key and a digest of what the calls returned in
the process that compiled it.  A process that loads calls them again and looks
up its own variant: ranks that fold the same answers (the world size alone)
share one entry, ranks that differ keep their own.

Plain Python: calls are ``(module, qualname, args, kwargs)`` with JSON values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from stableguards.codes import resolve
from stableguards.components import stable_repr

Call = tuple[str, str, tuple, tuple]  # (module, qualname, args, sorted kwargs items)


def dumps(calls: Iterable[Call]) -> bytes:
    """The calls an entry's variants are chosen by, as stored (sorted, JSON)."""
    rows = sorted({(m, q, tuple(a), tuple(k)) for m, q, a, k in calls}, key=repr)
    return json.dumps([[m, q, list(a), [list(item) for item in k]] for m, q, a, k in rows]).encode()


def variant(stored: bytes) -> str:
    """The variant for this process: the digest of what every stored call returns here.
    Raises (KeyError, AttributeError, TypeError, ...) when a call cannot be made here; the
    caller then has no variant to load."""
    answers = []
    for module, qualname, args, kwargs in json.loads(stored):
        result = resolve(module, qualname)(*args, **dict(kwargs))
        answers.append([module, qualname, args, kwargs, stable_repr(result)])
    return hashlib.sha256(json.dumps(answers).encode()).hexdigest()[:16]


def jsonable(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(jsonable(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))
