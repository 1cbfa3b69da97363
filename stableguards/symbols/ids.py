"""Stable symbol ids: the same source name gets the same id in every process.

torch 2.13 names a symbol after ``sha256(source name) % 100`` and probes linearly
on a clash.  With only 100 slots, two sources of one frame share a slot often
(more than half the time once 13 sources are dynamic), and then the ids follow
creation order.  Creation order changes with the set of dynamic sources (a PGO
profile marks some dimensions dynamic earlier than the cold run did), so the
symbol names in the graph change and so do the FX-graph and AOTAutograd cache
keys, which contain ``str(symbol)``.

Here the home slot comes from xxh64 of the name in an id space of a billion
slots, so a clash among even thousands of sources is rare (the chance is about
``n**2 / 2e9``: 0.05% for 1,000 sources), and an id depends on nothing but the
name unless a clash actually happened.  Probing stays linear, wrapping around
the space, so a clash still yields unique ids, deterministically for a given
order of creation.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

import xxhash

# Wide enough that clashes are rare, narrow enough that symbol names stay
# readable in graphs and logs (``s123456789`` at most).
DEFAULT_ID_SPACE = 1_000_000_000


@dataclass(frozen=True)
class Allocation:
    """Where a source name landed: its home slot, the id it got, the probes it took."""

    name: str
    home: int
    id: int
    probes: int


def home_slot(name: str, space: int = DEFAULT_ID_SPACE) -> int:
    """The id a source name gets when nothing else holds it; the same in every process."""
    return xxhash.xxh64_intdigest(name.encode("utf-8")) % space


def allocate(name: str, taken: Set[int], space: int = DEFAULT_ID_SPACE) -> Allocation:
    """Pick the first free id at or after the name's home slot, wrapping around.

    ``taken`` is only read: the caller records the id, so a failure between
    choosing and recording leaves its state untouched.
    """
    home = home_slot(name, space)
    probes = 0
    while (home + probes) % space in taken:
        probes += 1
        if probes == space:
            raise ValueError(f"all {space} symbol ids are taken")
    return Allocation(name, home, (home + probes) % space, probes)
