"""Compiled kernel binaries in the shared store, so a new machine loads what another one built.

inductor writes each CPU kernel as C++ and builds it into a shared library in the local cache
directory; a process on another machine has the C++ (it is in the compiled graph torch's caches
and warm start's entries hold) but not the library, and builds every kernel again.  With a
store named, each library built here is published beside its source, and a build whose library
is in the store is fetched instead of run.

A library is usable where the same compiler, run with the same command on the same sources, for
the same torch on the same platform, would build it, so its name in the store is the digest of
those components (``binary_key``): the command line (compiler, flags, vector ISA, include
paths, output) with the machine's own directories written as names, each source file's bytes,
the compiler's ``--version``, torch's version and the platform (OS, architecture, Python ABI).
Anything else gives another name: a miss, and a build, never another machine's binary.  Its
bytes are checked against their digest (and signature, with ``STABLEGUARDS_STORE_KEY``) before
they are written where torch will ``dlopen`` them.  Whether this CPU runs the vector
instructions is still torch's own check, run here (``pick_vec_isa`` runs a probe it builds,
or fetches, on this machine).  Plain logic: the hook (``store.hooks``) supplies the values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from stableguards.components import Components

def binary_key(command: str, sources: Mapping[str, bytes], directories: Mapping[str, str], compiler: str,
               torch_version: str, platform: str) -> Components:
    """The components a binary built by ``command`` from ``sources`` is usable under.
    ``directories`` maps a name to a directory of this machine (the cache directory, torch's
    install): the command names each by its name, so two machines with the same layout
    under other roots share binaries.  Longer directories are replaced first."""
    longest_first = [(label, path) for label, path in sorted(directories.items(), key=lambda item: -len(item[1]))
                     if path]
    for label, path in longest_first:
        command = command.replace(path, f"<{label}>")
    named_sources = {_named(path, longest_first): hashlib.sha256(data).hexdigest() for path, data in sources.items()}
    return Components((("command", command),
                       *((f"source {path}", digest) for path, digest in sorted(named_sources.items())),
                       ("compiler", compiler), ("torch", torch_version), ("platform", platform)))


def _named(path: str, longest_first: list[tuple[str, str]]) -> str:
    for label, directory in longest_first:
        if path.startswith(directory):
            return f"<{label}>{path[len(directory):]}"
    return path
