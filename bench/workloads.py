"""Workloads for the cross-restart A/B harness.

Each workload is a module-level function (so its code identity is the same in
every process) and a fixed sequence of calls.  The cold process and the warm
process make the same calls; the warm one should find everything it compiles
in the caches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    fn: Callable[..., object]
    # Shapes (and ints) of each call; make_args turns one into real inputs.
    calls: tuple[object, ...]
    make_args: Callable[[object, torch.Generator], tuple]


def _upstream_slot(source_name: str) -> int:
    """torch 2.13's home slot for a source (ShapeEnv._generate_unique_id)."""
    return int(hashlib.sha256(source_name.encode()).hexdigest(), 16) % 100


def colliding_keys(template: str, count: int = 2) -> tuple[str, ...]:
    """The first ``count`` dict keys k0, k1, ... whose sources share an upstream slot."""
    seen: dict[int, list[str]] = {}
    for i in range(10_000):
        key = f"k{i}"
        group = seen.setdefault(_upstream_slot(template.format(key=key)), [])
        group.append(key)
        if len(group) == count:
            return tuple(group)
    raise AssertionError("no collision found")


# --- seed: an int that varied, then specialized by range(n), touched first ----
#
# Cold process: the tensors vary first (compile 2: z dynamic, repeat static),
# then `repeat` varies (compile 3: repeat dynamic and at once specialized by
# range()).  A warm process with the profile marks `repeat` dynamic from its
# first compile, so `repeat` takes its slot before z does.  Under torch's
# % 100, L['repeat'] and L['z'].size()[0] share slot 68: z's symbol becomes
# s69 where compile 2 had s68, and the warm restart misses the cache.


def seed_fn(repeat, z):
    steps = range(repeat)  # Dynamo wraps inputs as they are used: `repeat` comes first
    acc = z * 0
    for i in steps:
        acc = acc + z * i
    return acc.sum()


def _seed_args(call, gen):
    repeat, size = call
    return repeat, torch.randn(size, generator=gen)


SEED = Workload(
    "seed",
    "int `repeat` varies after the tensor, range(repeat) specializes it; shares z's % 100 slot",
    seed_fn,
    ((3, 8), (3, 9), (4, 10)),
    _seed_args,
)


# --- dict of two tensors whose keys share an upstream slot -------------------
#
# The first entry is over-marked: it varies last and is specialized by range().
# The warm process creates its symbol first, pushing the second entry's symbol
# one slot on, exactly as in the seed case.

DICT_KEYS = colliding_keys("L['d'][{key!r}].size()[0]")


def dict_fn(d):
    first, second = (d[k] for k in DICT_KEYS)
    steps = range(first.shape[0])  # touched first, specialized at once
    acc = second.sin().sum()
    for _ in steps:
        acc = acc + first.sum()
    return acc


def _dict_args(call, gen):
    return ({key: torch.randn(size, generator=gen) for key, size in zip(DICT_KEYS, call)},)


DICT = Workload(
    "dict_collide",
    f"dict of two tensors, keys {DICT_KEYS} share torch's % 100 slot; the first is over-marked",
    dict_fn,
    ((4, 6), (4, 7), (5, 8)),
    _dict_args,
)


# --- a list of 40 tensors, 10 of them over-marked and touched first ----------

OVER_MARKED = 10
LIST_LEN = 40


def list_fn(xs):
    acc = xs[0].new_zeros(())
    for t in xs[:OVER_MARKED]:
        # range() over a size specializes it: PGO saw it vary but the graph is static in it.
        for _ in range(t.shape[0]):
            acc = acc + t.sum()
    for t in xs[OVER_MARKED:]:
        acc = acc + t.relu().sum()
    return acc


def _list_args(call, gen):
    return ([torch.randn(size, generator=gen) for size in call],)


def _list_call(others_step: int, marked_step: int) -> tuple[int, ...]:
    marked = tuple(2 + (i + marked_step) % 3 for i in range(OVER_MARKED))
    return marked + tuple(5 + i + others_step for i in range(LIST_LEN - OVER_MARKED))


# As in the seed case: the 30 plain entries vary first, the 10 over-marked ones
# last.  The warm process marks all 40 dynamic at once and creates the 10 first;
# under % 100, 40 sources in 100 slots collide, and the 30 shift.
LIST = Workload(
    "list_overmarked",
    f"list of {LIST_LEN} tensors, {OVER_MARKED} over-marked (range over their size) touched first",
    list_fn,
    (_list_call(0, 0), _list_call(1, 0), _list_call(1, 1)),
    _list_args,
)


# --- a closure: its code identity must survive the restart ---------------------
#
# torch 2.13 tells closures apart by hash() of their cells, which differs from
# one process to the next, so a compiled closure never finds its profile: the
# warm process compiles static first and recompiles, as if cold.


def _make_closure():
    def activation(t):
        return t.relu() * 2

    def closure_fn(x):
        return activation(x).sum() + x.shape[0]

    return closure_fn


def _closure_args(call, gen):
    return (torch.randn(call, generator=gen),)


CLOSURE = Workload(
    "closure",
    "a closure over a helper function; its sizes vary",
    _make_closure(),
    (8, 9, 10),
    _closure_args,
)


WORKLOADS = {w.name: w for w in (SEED, DICT, LIST, CLOSURE)}
