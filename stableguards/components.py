"""Named components: the one type behind every key and fingerprint stableguards makes.

As in JAX's ``cache_key.py``, a key is an ordered list of named components,
each a text that means the same in every process, and its digest hashes them
all.  Because the components are kept, two keys can be compared one component
at a time, and a miss can say which component changed.  Backend fingerprints,
warm-start entry keys and the FX-graph cache keys being explained are all
``Components``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid as uuid_module
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Components:
    """Named components, in order; equal components, equal digest."""

    items: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, items: Iterable[tuple[str, str]]) -> Components:
        return cls(tuple((str(name), str(value)) for name, value in items))

    @functools.cached_property
    def digest(self) -> str:
        return digest_text("\n".join(f"{name}={value}" for name, value in self.items))

    @functools.cached_property
    def by_name(self) -> dict[str, str]:
        """The components by name (built once: a miss's explanation asks a few hundred keys for
        every component)."""
        return dict(self.items)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.by_name.get(name, default)

    def differing(self, other: Components) -> list[str]:
        """The names whose values differ (or that only one has): this key's order, then the other's."""
        mine, theirs = self.by_name, other.by_name
        names = [n for n, _ in self.items] + [n for n, _ in other.items if n not in mine]
        return [n for n in names if mine.get(n) != theirs.get(n)]

    def differences(self, other: Components, *, minor: Callable[[str, str], bool] = lambda name, value: False,
                    show: Callable[[str, str], str] | None = None) -> list[str]:
        """``name: this vs other`` for each component that differs, in order.

        ``minor`` marks components that only follow from others (a label, a
        container's size): named only where nothing else differs.  ``show``
        writes a pair of values (default: both, shortened)."""
        mine, theirs = self.by_name, other.by_name
        differ = self.differing(other)
        telling = [n for n in differ if not minor(n, mine.get(n) or theirs.get(n) or "")]
        show = show or (lambda a, b: f"{short(a)} vs {short(b)}")
        return [f"{n}: {show(mine.get(n, ABSENT), theirs.get(n, ABSENT))}" for n in telling or differ]

    def as_json(self) -> list[list[str]]:
        return [list(item) for item in self.items]

    @classmethod
    def from_json(cls, data: Iterable[Iterable[str]]) -> Components:
        return cls.of(tuple(item) for item in data)  # type: ignore[misc]


ABSENT = "(absent)"


def digest_text(text: str) -> str:
    """The digest every key uses (sha256, hex)."""
    return hashlib.sha256(text.encode()).hexdigest()


def short(value: str, limit: int = 80) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


def stable_repr(value: Any) -> str:
    """``repr`` as every process writes it: sets and dicts sorted (string hashing's seed does
    not show).

    An object with a ``uuid()`` (inductor's ``CustomGraphPass``) is written by
    it, as torch's own cache keys do.  An object whose ``repr`` carries its
    address is written as one that only this process knows: the same here
    (torch's configuration copies, new on every read, keep one key), never
    found in another process, which costs a compile and is never wrong.
    """
    uuid = getattr(value, "uuid", None)
    if callable(uuid) and not isinstance(value, type):
        try:
            written = uuid()
        except Exception:  # noqa: BLE001 - a uuid() that fails: written as any other object
            written = None
        if written is not None:
            return f"{type(value).__qualname__}(uuid={written!r})"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({sorted(stable_repr(v) for v in value)})"
    if isinstance(value, dict):
        items = sorted((stable_repr(k), stable_repr(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(stable_repr(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    written = repr(value)
    return _ADDRESS.sub(f"at an address of process {_PROCESS}", written) if _ADDRESS.search(written) else written


# Object reprs with an address ("<X object at 0x7f...>"), and this process's own token for them.
_ADDRESS = re.compile(r"at 0x[0-9a-fA-F]+")
_PROCESS = uuid_module.uuid4().hex
