"""What an operator computes, told the same way in every process: its kernels, not its name.

A graph names an operator by its qualified name (``mylib::foo.default``), and
so do torch's FX-graph and AOTAutograd cache keys and a compiled frame's
entry.  For torch's own operators that is enough: their kernels are torch's
code, which every key holds by torch's version.  A custom operator's kernels
are the user's Python functions, registered per dispatch key, and a trace
folds them in: AOTAutograd decomposes a ``CompositeImplicitAutograd`` kernel
into the graph, runs the fake (``Meta``) kernel for every shape and stride,
and differentiates through the ``Autograd`` kernel's backward.  A library
upgraded between two processes keeps the name and changes what the graph
holds.

So an operator is described by every Python kernel it has, each by what it
runs and reads (``identity.reads``), and the description is checked to
be complete against the dispatcher itself: each kernel the dispatcher holds
from Python (its table names the file a registration came from) must be one
this process saw registered (``hooks.operators``), or one torch's own
``custom_op`` machinery registered, whose user functions it keeps where they
can be read.  A kernel registered before stableguards could see it has no
description: whatever keys on the operator leaves it out (a warm-start entry)
or bypasses (a cache), and says so.

Kernels registered from C++ are named by their registration (dispatch key,
file and line): torch's are torch's version; an extension's are named by
where they were built, not by what they compute (see docs/warm_start.md).

Plain Python: the hook layer reads torch's tables and hands over strings and
functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# What the dispatcher prints for one kernel: "<key>: registered at <file>:<line> :: <signature> [ ... ]".
_KERNEL = re.compile(r"^(?P<key>\w+)(?:\[alias\])?: registered at (?P<file>.*?):(?P<line>\d+) :: ", re.M)
# A registration made from C or C++ (the macros record __FILE__); anything else is from Python.
_NATIVE_SUFFIXES = (".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh", ".mm")


class Opaque(Exception):
    """An operator whose kernels cannot all be described: nothing keyed on it is trusted."""


@dataclass(frozen=True)
class Registration:
    """One kernel the dispatcher holds for an operator: its dispatch key and where it was
    registered (for a Python kernel, where its ``torch.library.Library`` was made)."""

    key: str
    file: str
    line: int

    @property
    def from_python(self) -> bool:
        return not self.file.endswith(_NATIVE_SUFFIXES)


def registrations(dump: str) -> list[Registration]:
    """The kernels in the dispatcher's dump of one operator (``torch._C._dispatch_dump``)."""
    return [Registration(m.group("key"), m.group("file"), int(m.group("line"))) for m in _KERNEL.finditer(dump)]


@dataclass(frozen=True)
class Recorded:
    """A Python kernel this process saw registered, and where its library was made (which the
    dispatcher's table names for it while it is the kernel registered there)."""

    fn: Any
    file: str
    line: int


def describe(name: str, registered: Iterable[Registration], recorded: Mapping[str, Recorded],
             kept: Mapping[str, Any], *, torch_dir: str, torch_owned: bool, custom_op: bool,
             describe_fn: Callable[[Any], str | None]) -> str:
    """The description of operator ``name``; raises Opaque where it would not be complete.

    ``registered``: the dispatcher's kernels for it; ``recorded``: dispatch key -> the
    Python kernel this process saw registered there; ``kept``: the user functions torch
    keeps for it where they can be read (a ``custom_op``'s implementations, fake kernels,
    torch-dispatch rules, ``py_impl`` kernels), by label; ``torch_dir``: where torch's own
    files are; ``torch_owned``: the operator is torch's (defined by torch), so kernels from
    torch's files are torch's code; ``custom_op``: it was made by ``torch.library.custom_op``, whose kernels are
    torch's proxies for the functions ``kept`` holds.

    Each Python kernel the dispatcher holds must be accounted for: recorded here (and
    still the one registered there), or registered from torch's files where it is torch's
    code (a torch operator's), a ``custom_op``'s proxy, or ``register_fake``'s meta kernel,
    which runs the fake kernel ``kept`` holds.  Anything else was registered where this
    process could not see it, and nothing says what it computes.
    """
    parts = []
    recorded_here = {}
    for registration in sorted(set(registered), key=lambda r: (r.key, r.file, r.line)):
        if not registration.from_python:
            parts.append(f"{registration.key}: native {registration.file}:{registration.line}")
            continue
        seen = recorded.get(registration.key)
        if seen is not None and (seen.file, seen.line) == (registration.file, registration.line):
            recorded_here[f"kernel {registration.key}"] = seen.fn
            continue
        if registration.file.startswith(torch_dir) and (
                torch_owned or custom_op or (registration.key == "Meta" and "fake" in kept)):
            continue
        raise Opaque(f"{name} has a Python kernel for {registration.key} (its library was made at "
                     f"{registration.file}:{registration.line}) that stableguards did not see registered: what it "
                     f"computes cannot be checked in another process (register it with the flag on: "
                     f"TORCHDYNAMO_STABLE_GUARDS=1)")
    for label, fn in sorted({**recorded_here, **kept}.items()):
        described = describe_fn(fn)
        if described is None:
            raise Opaque(f"{name}'s {label} ({fn!r:.80}) reads something with no identity that holds in another "
                         f"process")
        parts.append(f"{label}: {described}")
    return f"{name}: " + "; ".join(parts)
