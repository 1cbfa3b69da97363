"""What a saved entry trusts, for a reviewer: ``python -m stableguards audit``.

A warm start serves an entry once its proof holds in the new process
(``warm_start.proof``): every fact the cold process's guards proved, and every
unguarded fact it recorded.  Most facts are code that checks a value and means
the same in any process; the ones worth a reviewer's eye are those that trust
an object by *identity* (an id check, a type check, the torch-function modes),
where the proof compares a description of the object instead
(``identity.objects``), and the unguarded facts (hooks, builtins read,
environment variables, folded calls, custom operators, the hash seed).  Each is
listed with what its description covers.

Plain Python: ``warm_start.hooks.saved`` reads the entries and hands over proofs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from stableguards.warm_start.facts import KINDS as UNGUARDED
from stableguards.warm_start.guard_rules import RULES, Check
from stableguards.identity.covers import covers
from stableguards.warm_start.proof import Proof

_BY_IDENTITY = frozenset(kind for kind, rule in RULES.items()
                         if rule.check in (Check.IDENTITY, Check.TYPE_IDENTITY, Check.STATE_IDENTITY))


@dataclass(frozen=True)
class Trusted:
    """One thing an entry trusts: where, by which kind of fact, as what, and what that covers."""

    source: str
    kind: str
    what: str
    covers: str


def trusted(proof: Proof) -> Iterator[Trusted]:
    """The identities and unguarded facts of ``proof``, in its order."""
    for fact in proof.facts:
        if fact.kind in _BY_IDENTITY:
            for description in descriptions(fact.claim, RULES[fact.kind].check is Check.STATE_IDENTITY):
                yield Trusted(fact.source, fact.kind, description, covers(description))
    for recheck in proof.rechecks:
        yield Trusted(recheck.fact.source, recheck.fact.kind, recheck.fact.claim, _UNGUARDED_COVERS.get(
            recheck.fact.kind, "checked again in the warm process before the entry serves"))


_UNGUARDED_COVERS = {
    "MODULE_HOOKS": "the module's hooks by identity, with their flags, in order",
    "GLOBAL_MODULE_HOOKS": "every global module hook by identity, with its flags, in order",
    "UNSHADOWED_BUILTINS": "that no global of the module shadows the builtins its code reads",
    "CONSTANT_RESULT": "the call's result, called again with the same arguments",
    "ENVIRONMENT": "the variable's value, or its absence",
    "UNTRACED_READS": "what the function runs and reads, recursively",
    "GRAPH_TENSORS": "what the compiled code sees of each tensor it takes, and which share storage",
    "OPERATOR_KERNELS": "every kernel of the operator, by what it runs and reads (stableguards.operators)",
    "HASH_SEED": "the str and bytes hash seed (PYTHONHASHSEED)",
}
assert set(_UNGUARDED_COVERS) == set(UNGUARDED)


def descriptions(claim: str, state: bool = False) -> list[str]:
    """The object descriptions in an identity fact's claim: each ``<...>`` the proof wrote in
    place of an id (``, <...>)``; brackets nest), or for a ``state`` identity (its code names
    nothing) what follows `` with ``."""
    if state:
        return [claim.rpartition(" with ")[2]]
    found, depth, start = [], 0, 0
    for index, char in enumerate(claim):
        if char == "<":
            depth, start = depth + 1, index + 1 if depth == 0 else start
        elif char == ">" and depth:
            depth -= 1
            # The proof writes ``, <description>)`` where the check had the id (not ``type=<class ...>``).
            if depth == 0 and claim[start - 3:start - 1] == ", " and claim[index + 1:index + 2] == ")":
                found.append(claim[start:index])
    return found


def report(entries: Iterable[tuple[str, list[Proof | None]]]) -> str:
    """The audit, as text: per entry (its name), per compile, what it trusts."""
    lines = []
    for name, proofs in entries:
        lines.append(name)
        for index, proof in enumerate(proofs):
            if proof is None:
                lines.append(f"  compile {index}: no proof (not stableguards' entry, or unreadable)")
                continue
            rows = list(trusted(proof))
            lines.append(f"  compile {index}: {len(proof.facts)} guard facts, {len(rows)} trusted")
            for row in rows:
                lines.append(f"    {row.kind} on {row.source}: {_short(row.what)}")
                lines.append(f"      covers: {row.covers}")
    return "\n".join(lines) if lines else "no saved entries"


def _short(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


__all__ = ["Trusted", "descriptions", "report", "trusted"]
