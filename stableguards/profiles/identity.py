"""Identities that are the same in every process: closure fingerprints and profile keys.

torch 2.13 tells closures apart with ``hash()`` of their cells' code objects,
and on Python 3.11 that hash changes from one process to the next (it mixes
in ``hash(None)``, an address), so a compiled closure never finds its profile
after a restart.  Here a closure is told by its functions' code digests
(``stableguards.codes``), never with ``hash()``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import CellType, CodeType

import xxhash

from stableguards.codes import code_digest


def closure_fingerprint(cells: Sequence[CellType]) -> str:
    """A stable hash of a closure, told apart by the functions it closes over.

    Like torch's closure hash it looks only at cells holding functions; other
    captured values are guarded on, not part of the frame's identity.
    """
    parts = []
    for cell in cells:
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            contents = None
        code = getattr(contents, "__code__", None) if callable(contents) else None
        parts.append(code_digest(code) if isinstance(code, CodeType) else "-")
    return xxhash.xxh64_hexdigest(",".join(parts).encode())


def default_profile_key() -> str:
    """The profile key when no job id is set: what identifies the entry point.

    The entry point is the script's absolute path or, under ``python -m`` and
    in interactive sessions (a REPL, ``python -c``, a notebook kernel), the
    module's name with the project root: ``python -m pytest`` in two projects
    runs the same module, and must not share one profile.  Command-line
    arguments are left out on purpose: runs of one program usually differ in
    arguments (a learning rate, a seed) that change nothing about shapes, and
    splitting the profile on them would make every such run start cold.
    Merging is sound (see profile.py), so programs that do need separate
    profiles set TORCH_COMPILE_JOB_ID, which wins.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        entry, label = f"-m {spec.name} in {project_root()}", spec.name
    elif sys.argv and sys.argv[0] not in ("", "-", "-c"):
        entry = os.path.abspath(sys.argv[0])
        label = os.path.splitext(os.path.basename(entry))[0]
    else:
        entry, label = f"interactive in {project_root()}", "interactive"
    return f"{label}-{xxhash.xxh64_hexdigest(entry.encode())[:12]}"


_PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg", ".hg")


def project_root(start: str | None = None) -> str:
    """The nearest directory at or above ``start`` (the working directory) that holds a
    project marker (``.git``, ``pyproject.toml``, ...), else ``start`` itself."""
    here = os.path.abspath(start or os.getcwd())
    for directory in (here, *_parents(here)):
        if any(os.path.exists(os.path.join(directory, marker)) for marker in _PROJECT_MARKERS):
            return directory
    return here


def _parents(path: str) -> list[str]:
    parents = []
    while (parent := os.path.dirname(path)) != path:
        parents.append(parent)
        path = parent
    return parents
