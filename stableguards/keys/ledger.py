"""Why did the FX-graph cache miss?  Diff the key, component by component.

inductor builds its cache key from named components (the graph, each example
input, every inductor config value, the torch version...) and can list them
as ``[hash] name: value`` lines.  Kept in a small ledger beside the cache,
those lines let a later process that misses find the recorded key closest to
its own and name exactly what differs: a symbol renamed in one input
(``('s68',)`` against ``('s69',)``), a config value, a line of the graph.
The idea is JAX's cache-key logging, applied after the fact.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from stableguards.components import Components
from stableguards.files import atomic_write
from stableguards.storage.engines import Engine, Refused

_LINE = re.compile(r"\[(?P<hash>[^\]]+)\] (?P<name>[^:]+): (?P<value>.*)", re.DOTALL)
# Enough of a value to show what differs; the graph's code can be long.
_MAX_VALUE = 4000
_ABSENT = "<absent>"
# How many keys the ledger keeps (least recently used evicted), so the most a miss reads.
_MAX_CANDIDATES = 500
# The most a shared ledger's record or list may hold (components of a few KB each, 500 keys).
_RECORD_BYTES = 4 << 20


@dataclass(frozen=True)
class KeyRecord:
    """A cache key and its components: each component's hash (what decides the key), and its
    value as inductor printed it (what a reader is shown)."""

    key: str
    hashes: Components
    values: dict[str, str]

    @classmethod
    def from_debug_lines(cls, key: str, lines: Iterable[str]) -> KeyRecord:
        found = {m["name"]: (m["hash"], m["value"][:_MAX_VALUE]) for m in map(_LINE.match, lines) if m}
        return cls(key, Components.of((name, h) for name, (h, _) in found.items()),
                   {name: value for name, (_, value) in found.items()})

    def shared(self, other: KeyRecord) -> int:
        return sum(1 for name, h in self.hashes.items if other.hashes.get(name) == h)

    def as_json(self) -> dict:
        return {"key": self.key, "components": {n: [h, self.values.get(n, "")] for n, h in self.hashes.items}}

    @classmethod
    def from_json(cls, data: dict) -> KeyRecord:
        """The record JSON ``data`` holds.  Raises ValueError for anything else (a shared
        ledger is plain data anyone who can write the store may have written)."""
        components = data.get("components") if isinstance(data, dict) else None
        if not isinstance(components, dict) or not all(isinstance(v, list) and len(v) == 2
                                                       for v in components.values()):
            raise ValueError("not a key record")
        return cls(str(data["key"]), Components(tuple((n, str(v[0])) for n, v in components.items())),
                   {n: str(v[1]) for n, v in components.items()})


def nearest(record: KeyRecord, candidates: Iterable[KeyRecord]) -> KeyRecord | None:
    """The recorded key most like ``record``'s (never itself), or None.

    The same graph compiled before under another key is the most telling
    match (its other components say why the key changed), so candidates with
    an identical ``gm`` component come first; then the most shared components.
    """
    graph = record.hashes.get("gm", "")

    def likeness(candidate: KeyRecord) -> tuple[bool, int]:
        return candidate.hashes.get("gm") == graph, record.shared(candidate)

    best = max((c for c in candidates if c.key != record.key), key=likeness, default=None)
    return best if best is not None and record.shared(best) > 0 else None


def differences(new: KeyRecord, old: KeyRecord) -> list[str]:
    """What differs, one line per component, showing the first differing line of long values;
    components whose hashes differ but print the same come last, said so, in one line."""
    differing = sorted(new.hashes.differing(old.hashes))
    printed = [n for n in differing if old.values.get(n, _ABSENT) != new.values.get(n, _ABSENT)]
    alike = [n for n in differing if n not in printed]
    return [f"{name}: {_first_difference(old.values.get(name, _ABSENT), new.values.get(name, _ABSENT))}"
            for name in printed] + ([f"{len(alike)} more whose hashes differ but that print the same ("
                                     f"{', '.join(alike[:3])}{', ...' if len(alike) > 3 else ''})"] if alike else [])


def _first_difference(old: str, new: str) -> str:
    old_lines, new_lines = old.splitlines() or [""], new.splitlines() or [""]
    if len(old_lines) == 1 and len(new_lines) == 1:
        at = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        return f"{_window(old, at)} -> {_window(new, at)}"
    for tag, i1, _, j1, _ in difflib.SequenceMatcher(a=old_lines, b=new_lines).get_opcodes():
        if tag != "equal":
            before = old_lines[i1] if i1 < len(old_lines) else "<end>"
            after = new_lines[j1] if j1 < len(new_lines) else "<end>"
            return f"line {j1 + 1}: {_clip(before.strip())} -> {_clip(after.strip())}"
    return "same text, different hash"


def _window(text: str, at: int, before: int = 30, after: int = 60) -> str:
    """The part of a long one-line value around position ``at``, where it differs."""
    start, end = max(0, at - before), at + after
    return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class KeyLedger:
    """One small JSON file per recorded key, in a directory beside the cache.

    Bounded: at most ``capacity`` records, least recently used evicted first
    (recording a key again counts as a use), so a miss reads at most that many.
    """

    def __init__(self, directory: str | os.PathLike[str], capacity: int = _MAX_CANDIDATES) -> None:
        self.directory = Path(directory)
        self.capacity = capacity

    def record(self, record: KeyRecord) -> None:
        path = self.directory / f"{record.key}.json"
        if path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)  # used again: the last to be evicted
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(record.as_json()).encode())
        self._evict()

    def _evict(self) -> None:
        paths = list(self.directory.glob("*.json"))
        if len(paths) <= self.capacity:
            return
        for path in sorted(paths, key=_mtime)[: len(paths) - self.capacity]:
            with contextlib.suppress(OSError):  # another process may have evicted it first
                path.unlink()

    def recent(self, limit: int = _MAX_CANDIDATES) -> list[KeyRecord]:
        """The most recently recorded keys; unreadable files are skipped (this only explains)."""
        if not self.directory.is_dir():
            return []
        paths = sorted(self.directory.glob("*.json"), key=_mtime, reverse=True)[:limit]
        records = []
        for path in paths:
            try:
                records.append(KeyRecord.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError, IndexError):
                continue
        return records


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class SharedKeyLedger:
    """The ledger in a shared store (``STABLEGUARDS_STORE``), so a process on another machine can
    explain its miss against keys recorded anywhere: each record under ``fx_keys/<key>``, and a list
    of the most recent keys, newest first, under ``fx_keys/recent``.

    Plain JSON through the engine, not content-addressed or signed entries: a ledger only
    explains and is never unpickled.  Two processes recording at once may each drop the other's
    key from the list (read, then write): a later miss then explains against fewer keys.
    """

    RECENT = "fx_keys/recent"

    def __init__(self, engine: Engine, capacity: int = _MAX_CANDIDATES) -> None:
        self.engine = engine
        self.capacity = capacity

    def record(self, record: KeyRecord) -> None:
        recent = self._recent_keys()
        if recent[:1] == [record.key]:
            return
        if record.key not in recent:
            self.engine.put(f"fx_keys/{record.key}", json.dumps(record.as_json()).encode())
        recent = [record.key] + [k for k in recent if k != record.key]
        self.engine.put(self.RECENT, json.dumps(recent[: self.capacity]).encode())

    def recent(self, limit: int = _MAX_CANDIDATES) -> list[KeyRecord]:
        records = []
        for key in self._recent_keys()[:limit]:
            try:
                raw = self.engine.get(f"fx_keys/{key}", _RECORD_BYTES)
                if raw is not None:
                    records.append(KeyRecord.from_json(json.loads(raw)))
            except (ValueError, KeyError, TypeError, Refused):
                continue
        return records

    def _recent_keys(self) -> list[str]:
        try:
            keys = json.loads(self.engine.get(self.RECENT, _RECORD_BYTES) or b"[]")
        except (ValueError, Refused):
            return []
        return [k for k in keys if isinstance(k, str) and _KEY.fullmatch(k)] if isinstance(keys, list) else []


# A key as inductor makes them (a name in the store: nothing that climbs out of its folder).
_KEY = re.compile(r"[A-Za-z0-9_]{1,128}")
