"""Which saved guard proves, in another process, what a live guard proved in this one.

A compiled frame's guards are a tree of C++ leaf guards, each on a source
(``L['x']``, ``G['helpers'].K``) with a kind (``TENSOR_MATCH``) and the code
it checks.  torch saves an entry's guards and rebuilds the tree when a
restarted process loads it: from the values saved with the entry, but for
some guards from whatever that process holds at load (an object pickled by
name is the one of that name *there*; the default device and saved-tensor
hooks are read when the tree is built).  So a loaded tree is never trusted for
what it is: each live guard becomes a ``Fact`` (source, kind, what it proves,
in words that mean the same in every process), and an entry is used only
where every fact of the cold process's live tree is also a fact of the tree
the warm process loaded, checked on the warm call (``unproven``).

``RULES`` says, for each kind, how its fact is written and why that is sound.
A kind not in the table, or a fact that cannot be written (an id with no
cross-process identity), leaves the entry out.  Everything here is plain
Python: the hook layer walks torch's trees and hands over strings and values.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from stableguards.identity.distributed import dtensor_spec, opaque_guarded


class Check(enum.Enum):
    """How a kind's fact is written."""

    SAME = "its code, as printed"
    IDENTITY = "the identity of the object it checks, for the id in its code"
    TYPE_IDENTITY = "the identity of the object's type, for the type id in its code"
    STATE_IDENTITY = "the identity of what the saved state holds for it (its code names nothing)"
    AMBIENT = "the process's state on the call it serves"
    VALUE = "the value at its source, written by what the check compares (a check that passed on it compares equal)"
    REFUSE = "no fact: the entry is left out"


@dataclass(frozen=True)
class Rule:
    check: Check
    why: str
    # For a VALUE rule: the value at the source, written by what the check compares (None: not such a value).
    written: Callable[[Any], str | None] | None = None


_SAME_PRINTED = ("built from the value saved with the entry, which its code prints in full; the same code "
                 "checks the same thing in any process")
RULES: dict[str, Rule] = {
    "TENSOR_MATCH": Rule(Check.SAME, "dtype, device, dispatch keys, requires_grad, sizes and strides are "
                                     "printed in full and rebuilt from the saved tensor"),
    "EQUALS_MATCH": Rule(Check.SAME, "the expected value is printed with repr: equal code, equal value; a value "
                                     "whose repr carries an address never matches another process (a miss)"),
    **{kind: Rule(Check.SAME, _SAME_PRINTED) for kind in (
        "DIMENSION_DYNAMIC_MARKING_GUARD", "DICT_CONTAINS", "DICT_LENGTH", "LENGTH_CHECK", "NONE_MATCH",
        "NOT_NONE", "TRUE_MATCH", "FALSE_MATCH", "NO_HASATTR", "TUPLE_ITERATOR_LEN", "RANGE_ITERATOR_MATCH",
        "SET_CONTAINS", "FLOAT_IS_NAN", "COMPLEX_IS_NAN", "MAPPING_KEYS_MATCH", "DISPATCH_KEY_SET_MATCH",
        "SYMBOLIC_SHAPE_GUARD", "DUAL_LEVEL_MATCH")},
    **{kind: Rule(Check.SAME, "relates sources to each other by name (aliasing, overlap): the same statement "
                              "in any process") for kind in ("OBJECT_ALIASING", "NO_TENSOR_ALIASING",
                                                             "STORAGE_OVERLAPPING")},
    "GLOBAL_STATE": Rule(Check.SAME, "grad mode, autocast, default dtype, deterministic algorithms and the rest "
                                     "are printed and rebuilt from the state saved when tracing began"),
    "ID_MATCH": Rule(Check.IDENTITY, "an id means nothing in another process; the object now at the source, "
                                     "which the rebuilt check makes the one of the saved id, must be equivalent "
                                     "to the cold one by identity.objects (code, defaults, closure, methods)"),
    "TYPE_MATCH": Rule(Check.TYPE_IDENTITY, "as ID_MATCH, for the object's class: same import name and methods"),
    "TORCH_FUNCTION_MODE_STACK": Rule(Check.STATE_IDENTITY, "checks the types of the active torch function "
                                                            "modes against the saved stack's, whose classes "
                                                            "are found by name when loaded: compared by identity"),
    "EPILOGUE_LAMBDA_GUARD": Rule(Check.SAME, "torch compiles an epilogue lambda from its code parts (shape "
                                              "guards, object aliasing), saved with the entry: it runs the code it "
                                              "prints, against the frame's sources"),
    "DEFAULT_DEVICE": Rule(Check.AMBIENT, "C++ reads the default device when the tree is built, not the saved "
                                          "one it prints: the call's device is compared with the cold one"),
    "DICT_VERSION": Rule(Check.REFUSE, "a dict's version counter is this process's own"),
    "FAKE_SCRIPT_TYPE_MATCH": Rule(Check.TYPE_IDENTITY, "as TYPE_MATCH, for the type of the object at the source "
                                                        "(of the real object a fake script object stands for)"),
}

# LAMBDA_GUARD is a Python closure; only lambdas whose code says all they check have rules.
_SAVED_TENSOR_HOOKS = "torch._functorch.aot_autograd.utils.top_saved_tensors_hooks ids =="
LAMBDA_RULES: dict[str, Rule] = {
    _SAVED_TENSOR_HOOKS: Rule(Check.AMBIENT, "the hook ids are read from the process when the tree is built: the "
                                             "call's inlineable saved-tensor hooks are compared with the cold "
                                             "ones, and only 'none' can be compared across processes"),
    # stableguards' own guard on inlined hooks (autograd_cache): compiles under such hooks stay
    # out of warm start, as under torch's id() guard.
    "stableguards: the inlined saved-tensor hooks compute": Rule(
        Check.REFUSE, "inlineable saved-tensor hooks are active: compiles under them are left out of warm start"),
    "torch._functorch.pyfunctorch.compare_functorch_state(": Rule(
        Check.SAME, "the functorch interpreter states are printed and rebuilt from the saved layers"),
    # DTENSOR_SPEC_MATCH's code names only its closure.  It is rebuilt from the spec saved with the entry and
    # checked on the call it serves first, so the spec there passed it: that spec, written by what the check
    # compares, says what the loaded check compares with.
    "__dtensor_spec_": Rule(Check.VALUE, "a DTensor's spec (mesh, placements, shard order, dtype) is compared "
                                         "with the saved one by value: the spec at the source on the call, "
                                         "which passed the check, is written by those values "
                                         "(identity.distributed)", dtensor_spec),
    # OPAQUE_OBJ_GUARD_FN_MATCH, likewise: its code names its closure, which compares what the opaque
    # type's guard_fn returns with the saved values.
    "___check_opaque_guard_fn_": Rule(Check.VALUE, "an opaque object (a device mesh, a process group) is compared "
                                                   "by what its type's guard_fn returns: the object at the source "
                                                   "on the call, which passed the check, is written by a "
                                                   "description at least as fine (identity.distributed)",
                                      opaque_guarded),
}
# The text of stableguards' own id check bound on the entry's first call
# (hooks.rebuilt_checks.ID_ON_FIRST_CALL), as a string literal (torch evaluates a failed guard's
# code to name it).  Its fact is the ID_MATCH it stands for, written once the proof has
# bound it (hooks.proofs); a live tree never holds one.
FIRST_CALL = "stableguards: bound on the entry's first call #"
FIRST_CALLS_OBJECT = "<the object of its first call>"  # where the proof writes the bound object's id
FIRST_CALLS_VERSION = "<the version of its first call>"  # a dict's version check bound likewise
_REFUSED = Rule(Check.REFUSE, "no rule for this kind: what it proves in another process is not known")


def rule_for(kind: str, code: str = "") -> Rule:
    """The rule for a leaf guard of ``kind`` whose (comment-free) code is ``code``."""
    if kind == "LAMBDA_GUARD":
        return next((r for prefix, r in LAMBDA_RULES.items() if code.startswith(prefix)), _REFUSED)
    return RULES.get(kind, _REFUSED)


@dataclass(frozen=True)
class Fact:
    """What one leaf guard proves, written the same way in every process."""

    source: str
    kind: str
    claim: str

    def describe(self) -> str:
        return f"{self.kind} on {self.source}: {self.claim}"


class Unprovable(Exception):
    """A live guard whose fact cannot be written: the entry is left out."""


def code_of(parts: Iterable[str]) -> str:
    """A leaf guard's code without the comments torch adds (the user's source line)."""
    return "\n".join(_HINT.sub("", _split_comment(p)[0]) for p in parts)


def fact(source: str, kind: str, parts: Iterable[str], *, value: Callable[[], Any] | None = None,
         identity: Callable[[Any], str | None] | None = None, ambient: str | None = None) -> Fact:
    """The fact of one leaf guard.

    ``value`` returns the object the guard checks (called only for identity
    kinds), ``identity`` describes objects (``identity.objects``),
    ``ambient`` is the process's state for an AMBIENT kind, written as the
    guard's code writes it.  Raises Unprovable when there is no fact.
    """
    parts = tuple(parts)
    code = code_of(parts)
    rule = rule_for(kind, code)
    if rule.check is Check.SAME:
        return Fact(source, kind, code)
    if rule.check is Check.AMBIENT:
        if ambient is None:
            raise Unprovable(f"{kind} on {source}: {code!r} reads the process's state, which was not given")
        return Fact(source, kind, ambient)
    if rule.check is Check.REFUSE:
        raise Unprovable(f"{kind} on {source} ({_short(code)!r}): {rule.why}")
    if rule.check is Check.VALUE and rule.written is not None and value is not None:
        written = rule.written(value())
        if written is None:
            raise Unprovable(f"{kind} on {source} ({_short(code)!r}): the value there is not what the check compares")
        return Fact(source, kind, written)
    if value is None or identity is None:
        raise Unprovable(f"{kind} on {source}: its object was not given")
    obj = value()
    if rule.check is Check.TYPE_IDENTITY:
        obj = type(getattr(obj, "real_obj", obj) if type(obj).__name__ == "FakeScriptObject" else obj)
    if rule.check is not Check.STATE_IDENTITY:
        ids = {int(m.group(2)) for m in _IDS.finditer(code)}
        if ids != {id(obj)}:
            raise Unprovable(f"{kind} on {source}: its code checks id(s) {sorted(ids)}, not the id of the object "
                             f"found there ({id(obj)})")
    described = identity(obj)
    if described is None:
        line = _user_line(parts)
        raise Unprovable(f"{kind} on {source}: {_short(repr(obj))} has no identity that holds in another "
                         f"process (see identity.objects)" + (f"; Dynamo checks it for `{line}`" if line else ""))
    if rule.check is Check.STATE_IDENTITY:
        return Fact(source, kind, f"{code} with {described}")
    return Fact(source, kind, _IDS.sub(lambda m: f"{m.group(1)}<{described}>)", code))


def one_object(facts: tuple[Fact, ...], value: Callable[[str], Any],
               by_state: Callable[[str, Any], bool]) -> tuple[Fact, ...]:
    """The id checks on objects whose identity is their state (``by_state(source, obj)``: an
    optimizer, an object whose id was only a key), each saying which other sources hold the
    same object.

    Two sources that held one optimizer were one object to the compile (a
    mutation through one is seen through the other); their id checks, bound
    in another process each to its own first call's object, would pass for
    two equal optimizers.  So which sources share an object is part of each
    fact, in the cold process and in the warm one alike."""
    sources: dict[int, set[str]] = {}
    for f in facts:
        if f.kind == "ID_MATCH":
            try:
                obj = value(f.source)
            except Unprovable:
                continue
            if by_state(f.source, obj):
                sources.setdefault(id(obj), set()).add(f.source)
    shared = {source: group for group in sources.values() if len(group) > 1 for source in group}
    return tuple(Fact(f.source, f.kind, f"(one object at {', '.join(sorted(shared[f.source]))}) {f.claim}")
                 if f.kind == "ID_MATCH" and f.source in shared else f for f in facts)


def unproven(cold: Iterable[Fact], warm: Iterable[Fact]) -> list[Fact]:
    """The cold facts the warm tree does not prove, in order.  A warm tree may prove more
    (another guard is only stricter); it may not prove less.

    A NO_TENSOR_ALIASING fact says that the tensors at its sources share no storage:
    a warm guard over a superset of those sources proves it, wherever in the tree it
    hangs (torch attaches it to one of its sources, and a rebuilt tree may group the
    tensors otherwise)."""
    warm = list(warm)
    have = set(warm)
    disjoint = [sources for f in warm if f.kind == _NO_ALIASING and (sources := _call_args(f.claim)) is not None]

    def proven(fact: Fact) -> bool:
        if fact in have:
            return True
        sources = _call_args(fact.claim) if fact.kind == _NO_ALIASING else None
        return sources is not None and any(sources <= wider for wider in disjoint)

    return [f for f in cold if not proven(f)]


_NO_ALIASING = "NO_TENSOR_ALIASING"


@functools.lru_cache(maxsize=1024)  # a claim over every parameter of a model is long, and met twice
def _call_args(claim: str) -> frozenset[str] | None:
    """The arguments of a one-call claim, ``check_no_aliasing(a, b, ...)``, as a set; None for
    anything else.  Commas inside brackets, parentheses or quotes belong to an argument."""
    head, sep, rest = claim.partition("(")
    if not sep or not head.isidentifier() or not rest.endswith(")"):
        return None
    args, depth, quote, start = [], 0, "", 0
    body = rest[:-1]
    for index, char in enumerate(body):
        if quote:
            quote = "" if char == quote and body[index - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                return None  # the call closed before the end: not one call
        elif char == "," and depth == 0:
            args.append(body[start:index].strip())
            start = index + 1
    args.append(body[start:].strip())
    return None if depth or quote or "" in args else frozenset(args)


def explain_unproven(missing: list[Fact], warm: Iterable[Fact]) -> str:
    """Name the first fact the warm tree lacks, and what it has on that source instead."""
    first = missing[0]
    instead = [f.claim for f in warm if f.source == first.source and f.kind == first.kind]
    if not instead:
        text = f"{first.kind} on {first.source} proved {_short(first.claim)!r} in the cold process, and has no " \
               "counterpart here"
    else:  # from where the two claims first differ: a long claim's common start says nothing
        start = next((i for i, (a, b) in enumerate(zip(first.claim, instead[0])) if a != b),
                     min(len(first.claim), len(instead[0])))
        cut = max(0, start - 20)
        cold, warm_claim = (("..." if cut else "") + claim[cut:] for claim in (first.claim, instead[0]))
        text = (f"{first.kind} on {first.source} proved {_short(cold)!r} in the cold process, "
                f"here {_short(warm_claim)!r}")
    return text + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")


# ___check_obj_id(<source>, 140235...) and ___check_type_id(<source>, 9456...): the id is the last argument.
_IDS = re.compile(r"(___check_(?:obj_id|type_id|fake_script_type)\(.*, )(\d+)\)")


# Code up to the first ``#`` outside string literals: runs of other characters, and string
# literals, triple-quoted first (a quote that opens a triple-quoted literal never closes early).
_CODE = re.compile(r"""(?:[^'"#]+|'{3}(?:\\.|[^\\])*?'{3}|"{3}(?:\\.|[^\\])*?"{3}"""
                   r"""|'(?!'')(?:\\.|[^'\\])*'|"(?!"")(?:\\.|[^"\\])*")*""", re.S)


# What torch appends to a check's code for a user reading a recompile (``get_verbose_code_parts``):
# a message, not what is checked; a check bound on the first call has none.
_HINT = re.compile(r" \(HINT: [^()]*\)$")


def _split_comment(part: str) -> tuple[str, str]:
    """The code before a ``#`` outside string literals, without trailing spaces, and the
    comment after it (torch appends the user's source line and where it is), stripped: empty
    where there is none."""
    if "#" not in part:
        return part.strip(), ""
    end = _CODE.match(part).end()  # type: ignore[union-attr] - it matches the empty string
    if part.startswith("#", end):
        return part[:end].rstrip(), part[end + 1:].strip()
    return part.strip(), ""


def _user_line(parts: Iterable[str]) -> str:
    """The user's source line torch appends to a guard's code (what made Dynamo check it, and
    where), on one short line; empty where there is none."""
    return next((_short(comment) for comment in (_split_comment(p)[1] for p in parts) if comment), "")


def _short(text: str) -> str:
    """``text`` on one line (a config's repr is indented JSON), at most 120 characters."""
    text = " ".join(text.split())
    return text if len(text) <= 120 else text[:117] + "..."
