"""Say which static input moved when a cudagraph is re-recorded.

Under ``mode="reduce-overhead"`` inductor records a CUDA graph with the data
pointers of its static inputs (parameters, optimizer state) baked in.  When one
of them later lives at another address, torch 2.13's cudagraph trees re-record
the graph without a word: the step just gets slower and uses more memory.  This
module remembers, per recorded graph, each static input's address and its
Dynamo source, so that the call that triggers a re-record can name the tensor
that moved.  It is plain Python: addresses come from an injectable function, so
the logic runs (and is tested) without a GPU.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stableguards.hooks.core import PassThrough

# Shown after a move: the two ways to keep an address fixed across steps.
_HINT = (
    "mark a tensor with torch._dynamo.mark_static_address only if its address stays fixed, "
    "or keep the tensor in place (copy_ into it) instead of rebinding it"
)
# Grad names listed in full before the rest are only counted.
_MAX_NAMED = 3


def data_ptr(tensor: Any) -> int:
    """The address a CUDA graph bakes in for ``tensor``."""
    return tensor.data_ptr()


@dataclass(frozen=True)
class Moved:
    """A static input whose address differs from the one its graph recorded."""

    name: str
    index: int
    old: int
    new: int

    def describe(self) -> str:
        return f"{self.name} {self.old:#x} -> {self.new:#x}"


@dataclass(frozen=True)
class MoveReport:
    """The static inputs that moved on one call, and this graph's re-record count so far.

    With a report from ``check`` that count includes the re-record the move causes.
    """

    graph: Hashable
    moved: tuple[Moved, ...]
    rerecords: int

    def describe(self) -> str:
        moves = "; ".join(m.describe() for m in self.moved)
        return (
            f"cudagraph re-recorded ({_ordinal(self.rerecords)} time) because static inputs "
            f"moved: {moves}. To avoid it, {_HINT}."
        )


class StaticInputMoved(PassThrough, RuntimeError):
    """Strict mode: a static input moved, and re-recording the graph is refused."""

    def __init__(self, report: MoveReport) -> None:
        moves = "; ".join(m.describe() for m in report.moved)
        super().__init__(
            f"static inputs of a cudagraph moved (strict mode, so it is not re-recorded; "
            f"re-recorded {report.rerecords} time(s) before): {moves}. To avoid it, {_HINT}."
        )
        self.report = report


@dataclass(frozen=True)
class _Recording:
    """What a graph baked in: (index, name, address) per static input."""

    statics: tuple[tuple[int, str, int], ...]
    rerecords: int = 0


class StaticInputWatch:
    """Recorded static-input addresses per graph, compared on later calls.

    Graphs are keyed by torch's function id, an int counted per cudagraph
    tree manager: ids start again when torch resets the trees (an H100 run
    showed it), so the caller must ``clear()`` the watch then.  The table is bounded: it
    keeps the ``capacity`` graphs recorded or checked most recently, so a job that
    compiles without end does not grow it; a graph evicted and recorded again starts its
    re-record count anew.
    """

    def __init__(self, address_of: Callable[[Any], int] = data_ptr, capacity: int = 1024) -> None:
        self._address_of = address_of
        self._capacity = capacity
        self._recordings: collections.OrderedDict[Hashable, _Recording] = collections.OrderedDict()

    def _get(self, graph: Hashable) -> _Recording | None:
        recording = self._recordings.get(graph)
        if recording is not None:
            self._recordings.move_to_end(graph)
        return recording

    def _put(self, graph: Hashable, recording: _Recording) -> None:
        self._recordings[graph] = recording
        self._recordings.move_to_end(graph)
        while len(self._recordings) > self._capacity:
            self._recordings.popitem(last=False)

    def __len__(self) -> int:
        return len(self._recordings)

    def clear(self) -> None:
        """Forget every graph: their ids will be handed out again."""
        self._recordings.clear()

    def record(
        self,
        graph: Hashable,
        inputs: Sequence[Any],
        static_indices: Iterable[int],
        names: Sequence[str],
    ) -> None:
        """Remember the addresses ``graph`` baked in; ``names[i]`` names input ``i``.

        Recording a graph again keeps its re-record count: a re-record is still
        the same graph to the user.
        """
        statics = tuple(
            (i, names[i] if i < len(names) else f"input {i}", self._address_of(inputs[i]))
            for i in static_indices
        )
        previous = self._get(graph)
        self._put(graph, _Recording(statics, previous.rerecords if previous else 0))

    def check(self, graph: Hashable, inputs: Sequence[Any], *, strict: bool = False) -> MoveReport | None:
        """The static inputs of ``graph`` that moved, or None if none did or it was never recorded.

        A report counts as a re-record, and the new addresses become the recorded
        ones, since the graph is re-recorded with them.  With ``strict`` it raises
        ``StaticInputMoved`` instead and changes nothing: there is no re-record.
        """
        recording = self._get(graph)
        if recording is None:
            return None
        now = tuple((i, name, self._address_of(inputs[i])) for i, name, _ in recording.statics)
        moved = tuple(
            Moved(name, i, old, new)
            for (i, name, old), (_, _, new) in zip(recording.statics, now, strict=True)
            if new != old
        )
        if not moved:
            return None
        if strict:
            raise StaticInputMoved(MoveReport(graph, moved, recording.rerecords))
        updated = replace(recording, statics=now, rerecords=recording.rerecords + 1)
        self._put(graph, updated)
        return MoveReport(graph, moved, updated.rerecords)

    def forget(self, graph: Hashable) -> None:
        """Drop what was recorded for ``graph``, re-record count included."""
        self._recordings.pop(graph, None)


def input_names(placeholders: Sequence[str], sources: Sequence[str] | None) -> list[str]:
    """Names for a recorded graph's inputs: the Dynamo source behind each placeholder.

    The graph cudagraphs records is inductor's.  AOTAutograd numbers its flat
    inputs (the graph module's lifted parameters and buffers, then Dynamo's
    graph inputs in order) and names placeholders after that number:
    ``primals_3`` is flat input 2 in a forward graph and in the backward that
    saved it, ``arg3_1`` is flat input 3 of an inference graph.  The
    placeholders arrive in inductor's order, not that one (seen on an H100:
    ``primals_2, primals_3, primals_1``), so names are matched by number, never
    by position.  Anything else (``tangents_1``, saved activations) keeps
    inductor's name.
    """
    if sources is None:
        return list(placeholders)
    return [_source_of(name, sources) for name in placeholders]


def _source_of(placeholder: str, sources: Sequence[str]) -> str:
    match = _FLAT_INPUT.fullmatch(placeholder)
    if match is None:
        return placeholder
    primal, arg = match.groups()
    index = int(primal) - 1 if primal is not None else int(arg)
    return f"{sources[index]} ({placeholder})" if 0 <= index < len(sources) else placeholder


_FLAT_INPUT = re.compile(r"primals_(\d+)|arg(\d+)_1")


def copied_grads_message(names: Sequence[str]) -> str:
    """The warning for grads that are not static, so cudagraphs copy them in every step."""
    shown = ", ".join(names[:_MAX_NAMED])
    if len(names) > _MAX_NAMED:
        shown += f" and {len(names) - _MAX_NAMED} more"
    return (
        f"{len(names)} gradient(s) are not static inputs, so they will be copied into the "
        f"cudagraph's input buffers every step: {shown}. To avoid the copy, call "
        "stableguards.static_grads(opt): it marks the grads static and makes "
        "zero_grad(set_to_none=True) zero them in place instead of freeing them."
    )


def _ordinal(n: int) -> str:
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
