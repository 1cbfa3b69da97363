"""Specialization-aware profiles: what stayed dynamic, per frame and source.

torch 2.13's PGO records a dimension as dynamic as soon as it varies, even when
the compile then specializes it (``range(n)``, a guard ``s == 5``).  The next
process starts from that superset, creates symbols that vanish from the graph
and compiles a first graph the cold run never produced.  Here each dimension
(and each int or float input) is in one of five states:

    UNSET < STATIC(v) < VARIED < SPECIALIZED < DYNAMIC

* UNSET: nothing known.
* STATIC(v): always seen with value v.
* VARIED: seen with different values, but no compile has told us more (two
  processes each saw one value).  Handed on as dynamic, as upstream does.
* SPECIALIZED: a compile made it dynamic and then specialized it.  Handed on
  as *unset*, so the next process compiles it static first and marks it dynamic
  only when it varies again: it retraces the cold run's graphs.
* DYNAMIC: stayed dynamic in a compiled graph.  Handed on as dynamic.

The merge (``|``) is the join of that order, with STATIC(v) | STATIC(w) =
VARIED for v != w.  Why this is sound: a profile only chooses which graphs
get compiled, never what a graph computes (guards check every assumption),
so any merge is correct; the join makes it *convergent*.  It is commutative,
associative and idempotent, so profiles written by many processes in any order,
merged in any grouping, end in the same state, and a write can never lose
another writer's information.  SPECIALIZED below DYNAMIC means one graph that
kept a dimension dynamic outweighs graphs that specialized it: dynamic is then
the choice that compiles least.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

FORMAT = "stableguards-pgo"
VERSION = 1


class ProfileError(ValueError):
    """A profile that does not match the schema; the message says where."""


class State(enum.IntEnum):
    UNSET = 0
    STATIC = 1
    VARIED = 2
    SPECIALIZED = 3
    DYNAMIC = 4


# A static stride may be "stride[d] * size[d]" (torch's InferStride), written S(d).
StaticValue = int | float | str
_INFERRED_STRIDE = re.compile(r"S\(\d+\)")


@dataclass(frozen=True)
class Dim:
    """One dimension, int or float input: its state, plus the value or the reason."""

    state: State = State.UNSET
    value: StaticValue | None = None  # STATIC only
    reasons: frozenset[str] = frozenset()  # SPECIALIZED only: why, where the ShapeEnv knew

    def __or__(self, other: Dim) -> Dim:
        if self.state == State.STATIC and other.state == State.STATIC:
            return self if self.value == other.value else VARIED
        if self.state != other.state:
            return self if self.state > other.state else other
        if self.state == State.SPECIALIZED:
            return Dim(State.SPECIALIZED, reasons=self.reasons | other.reasons)
        return self

    def __str__(self) -> str:
        if self.state == State.STATIC:
            return str(self.value)
        if self.state == State.SPECIALIZED and self.reasons:
            return f"specialized({','.join(sorted(self.reasons))})"
        return self.state.name.lower()


UNSET = Dim()
VARIED = Dim(State.VARIED)
DYNAMIC = Dim(State.DYNAMIC)


def static(value: StaticValue) -> Dim:
    return Dim(State.STATIC, value)


def specialized(*reasons: str) -> Dim:
    return Dim(State.SPECIALIZED, reasons=frozenset(reasons))


# A tensor's sizes or strides: UNSET_DIMS (unknown rank), ALL_DYNAMIC (the rank
# changed, or the name was used for a scalar too), or one Dim per dimension.
Dims = tuple[Dim, ...] | Dim


def _merge_dims(a: Dims, b: Dims) -> Dims:
    if a == UNSET:
        return b
    if b == UNSET:
        return a
    if isinstance(a, Dim) or isinstance(b, Dim) or len(a) != len(b):
        return DYNAMIC
    return tuple(x | y for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class SourceEntry:
    """What is known about one input source of a frame (torch's FrameStateSizeEntry)."""

    scalar: Dim = UNSET
    size: Dims = UNSET
    stride: Dims = UNSET

    def __or__(self, other: SourceEntry) -> SourceEntry:
        return SourceEntry(
            self.scalar | other.scalar,
            _merge_dims(self.size, other.size),
            _merge_dims(self.stride, other.stride),
        )

    def dims(self) -> tuple[Dim, ...]:
        """The dimensions that describe this source: the value of a scalar, the sizes of a tensor."""
        if self.kind() == "scalar":
            return (self.scalar,)
        return self.size if isinstance(self.size, tuple) else (self.size,)

    def kind(self) -> str:
        if isinstance(self.size, tuple):
            return "tensor"
        if self.scalar != UNSET and self.size == DYNAMIC and self.stride == DYNAMIC:
            return "scalar"
        return "scalar or tensor"

    def __str__(self) -> str:
        if self.kind() == "scalar":
            return f"scalar {self.scalar}"
        return f"size={_render(self.size)} stride={_render(self.stride)}"


def _render(dims: Dims) -> str:
    return str(dims) if isinstance(dims, Dim) else "[" + ", ".join(map(str, dims)) + "]"


@dataclass(frozen=True)
class CodeKey:
    """A frame's identity, the same in every process that runs the same code.

    The filename is for people only: a job restarted from another checkout path
    still matches, because the file's content hash does.
    """

    file_hash: str
    firstlineno: int
    name: str
    closure: str | None = None
    filename: str = field(default="", compare=False)

    def sort_key(self) -> tuple[str, int, str, str]:
        return (self.file_hash, self.firstlineno, self.name, self.closure or "")

    def __str__(self) -> str:
        closure = f" closure={self.closure}" if self.closure else ""
        return f"{self.filename}:{self.firstlineno} {self.name} (file {self.file_hash}{closure})"


@dataclass(frozen=True)
class Profile:
    """Per frame, per source name (``L['x']``), what stayed dynamic."""

    frames: Mapping[CodeKey, Mapping[str, SourceEntry]] = field(default_factory=dict)

    def __or__(self, other: Profile) -> Profile:
        frames = {code: dict(sources) for code, sources in self.frames.items()}
        for code, sources in other.frames.items():
            mine = frames.setdefault(code, {})
            for name, entry in sources.items():
                mine[name] = mine[name] | entry if name in mine else entry
        return Profile(frames)

    def __le__(self, other: Profile) -> bool:
        """Whether ``other`` already knows everything this profile knows."""
        return (self | other) == other

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and _normal(self.frames) == _normal(other.frames)

    def entries(self) -> Iterator[tuple[CodeKey, str, SourceEntry]]:
        for code in sorted(self.frames, key=CodeKey.sort_key):
            for name in sorted(self.frames[code]):
                yield code, name, self.frames[code][name]

    def __len__(self) -> int:
        return sum(len(sources) for sources in self.frames.values())


def _normal(frames: Mapping[CodeKey, Mapping[str, SourceEntry]]) -> dict:
    return {code: dict(sources) for code, sources in frames.items() if sources}


# --- JSON: versioned, human-readable, diffable --------------------------------


def to_json(profile: Profile) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "frames": [
            {
                "code": _code_to_json(code),
                "sources": {
                    name: _entry_to_json(profile.frames[code][name])
                    for name in sorted(profile.frames[code])
                },
            }
            for code in sorted(profile.frames, key=CodeKey.sort_key)
            if profile.frames[code]
        ],
    }


def _code_to_json(code: CodeKey) -> dict[str, Any]:
    return {"filename": code.filename, "firstlineno": code.firstlineno, "name": code.name,
            "file_hash": code.file_hash, "closure": code.closure}


def dumps(profile: Profile) -> str:
    """The profile as JSON text with one source per line: easy to read and to diff.

    Same document as ``to_json``; written piecewise because ``json.dumps`` with
    ``indent`` falls back to the slow pure-Python encoder, and each source's line is
    kept (``_entry_text``): a process saves its profile after every compile, and all
    but the newest frame's sources are the ones it wrote the time before.
    """
    frames = []
    for code in sorted(profile.frames, key=CodeKey.sort_key):
        entries = profile.frames[code]
        if not entries:
            continue
        sources = ",\n".join(f"   {json.dumps(name)}: {_entry_text(entries[name])}" for name in sorted(entries))
        frames.append(f' {{"code": {json.dumps(_code_to_json(code), sort_keys=True)},\n'
                      f'  "sources": {{\n{sources}\n  }}}}')
    body = ",\n".join(frames)
    return (f'{{"format": "{FORMAT}", "version": {VERSION}, "frames": [\n'
            + (body + "\n" if body else "") + "]}\n")


@functools.lru_cache(maxsize=1 << 16)
def _entry_text(entry: SourceEntry) -> str:
    return json.dumps(_entry_to_json(entry), sort_keys=True)


def _entry_to_json(entry: SourceEntry) -> dict[str, Any]:
    return {
        "scalar": _dim_to_json(entry.scalar),
        "size": _dims_to_json(entry.size),
        "stride": _dims_to_json(entry.stride),
    }


def _dims_to_json(dims: Dims) -> Any:
    return _dim_to_json(dims) if isinstance(dims, Dim) else [_dim_to_json(d) for d in dims]


def _dim_to_json(dim: Dim) -> Any:
    if dim.state == State.STATIC:
        return {"static": dim.value}
    if dim.state == State.SPECIALIZED:
        return {"specialized": sorted(dim.reasons)}
    return dim.state.name.lower()


def from_json(data: Any) -> Profile:
    """Parse and check a profile; a ProfileError names the first part that is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"not a {FORMAT} profile")
    version = data.get("version")
    if version != VERSION:
        raise ProfileError(f"profile version {version!r:.20}; this stableguards reads version {VERSION}")
    frames_json = _expect(data.get("frames"), list, "frames")
    frames: dict[CodeKey, dict[str, SourceEntry]] = {}
    for i, frame in enumerate(frames_json):
        where = f"frames[{i}]"
        frame = _expect(frame, dict, where)
        code = _code_from_json(_expect(frame.get("code"), dict, f"{where}.code"), f"{where}.code")
        sources = _expect(frame.get("sources"), dict, f"{where}.sources")
        parsed = frames.setdefault(code, {})
        for name, entry in sources.items():
            at = f"{where}.sources[{name!r}]"
            entry = _expect(entry, dict, at)
            new = SourceEntry(
                _dim_from_json(entry.get("scalar"), f"{at}.scalar"),
                _dims_from_json(entry.get("size"), f"{at}.size"),
                _dims_from_json(entry.get("stride"), f"{at}.stride"),
            )
            parsed[name] = parsed[name] | new if name in parsed else new
    return Profile(frames)


def _code_from_json(code: dict, where: str) -> CodeKey:
    closure = code.get("closure")
    if closure is not None and not isinstance(closure, str):
        raise ProfileError(f"{where}.closure must be a string or null")
    return CodeKey(
        file_hash=_expect(code.get("file_hash"), str, f"{where}.file_hash"),
        firstlineno=_expect(code.get("firstlineno"), int, f"{where}.firstlineno"),
        name=_expect(code.get("name"), str, f"{where}.name"),
        closure=closure,
        filename=_expect(code.get("filename", ""), str, f"{where}.filename"),
    )


def _dims_from_json(data: Any, where: str) -> Dims:
    if isinstance(data, list):
        return tuple(_dim_from_json(d, f"{where}[{i}]") for i, d in enumerate(data))
    return _dim_from_json(data, where)


_NAMED_STATES = {"unset": UNSET, "varied": VARIED, "dynamic": DYNAMIC}


def _dim_from_json(data: Any, where: str) -> Dim:
    if isinstance(data, str) and data in _NAMED_STATES:
        return _NAMED_STATES[data]
    if isinstance(data, dict) and len(data) == 1:
        if "static" in data:
            value = data["static"]
            valid = (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
                isinstance(value, str) and _INFERRED_STRIDE.fullmatch(value)
            )
            if valid:
                return static(value)
        if "specialized" in data and isinstance(data["specialized"], list) and all(
            isinstance(r, str) for r in data["specialized"]
        ):
            return specialized(*data["specialized"])
    raise ProfileError(f"{where}: expected unset, varied, dynamic, {{static: v}} or "
                       f"{{specialized: [reasons]}}, got {data!r:.60}")


def _expect(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProfileError(f"{where} must be {kind.__name__}, got {type(value).__name__}")
    return value
