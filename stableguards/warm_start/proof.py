"""An entry's proof: what the cold process's guards proved, saved with them.

Saved inside the entry's guard state (plain tuples of strings and constants,
so loading it runs no code of ours), it holds the facts of the live guard tree
(``guard_rules``) and the facts Dynamo left unguarded (``facts``), each of the
latter with what the warm process needs to write it again.  ``check`` is the
comparison a warm process makes before an entry serves its first call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from stableguards.warm_start.guard_rules import Fact, Unprovable, explain_unproven, unproven

_FORMAT = "stableguards proof 2"


@dataclass(frozen=True)
class Recheck:
    """An unguarded fact and the plain data that writes it again (names, arguments)."""

    fact: Fact
    payload: Any = None


@dataclass(frozen=True)
class Proof:
    facts: tuple[Fact, ...]
    rechecks: tuple[Recheck, ...] = ()
    # (backend id, sources): a graph whose compiled code takes the tensors at these sources,
    # bound on the entry's first call, in front of its inputs (hooks.graph_params).
    graph_params: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def to_state(self) -> tuple:
        """Plain tuples, as saved with the guards."""
        return (_FORMAT, tuple((f.source, f.kind, f.claim) for f in self.facts),
                tuple(((r.fact.source, r.fact.kind, r.fact.claim), r.payload) for r in self.rechecks),
                self.graph_params)

    @classmethod
    def from_state(cls, state: Any) -> Proof | None:
        """The proof saved with an entry; None for anything else (no proof, another format)."""
        if not (isinstance(state, tuple) and len(state) == 4 and state[0] == _FORMAT):
            return None
        try:
            return cls(tuple(Fact(*f) for f in state[1]),
                       tuple(Recheck(Fact(*f), payload) for f, payload in state[2]),
                       tuple((backend, tuple(sources)) for backend, sources in state[3]))
        except (TypeError, ValueError):
            return None

    def bound_tensors(self) -> frozenset[str]:
        """The sources whose tensors a graph of the entry takes, bound on its first call."""
        return frozenset(source for _, sources in self.graph_params for source in sources)


def check(proof: Proof, warm_facts: Iterable[Fact], recheck: Callable[[Recheck], Fact]) -> str | None:
    """Why the warm process's tree and state do not prove what the cold one did, or None.

    ``warm_facts`` are the facts of the tree the warm process loaded, written
    on its call; ``recheck`` writes an unguarded fact again in the warm process
    (raising Unprovable when it cannot).
    """
    warm = list(warm_facts)
    missing = unproven(proof.facts, warm)
    if missing:
        return explain_unproven(missing, warm)
    for item in proof.rechecks:
        try:
            now = recheck(item)
        except Unprovable as why:
            return f"{item.fact.describe()} in the cold process; here it cannot be checked: {why}"
        if now != item.fact:
            return (f"{item.fact.kind} on {item.fact.source}: {item.fact.claim!r} in the cold process, "
                    f"{now.claim!r} here")
    return None
