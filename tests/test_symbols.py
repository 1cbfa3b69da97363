"""Properties of the stable symbol-id allocator (pure logic, no Dynamo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stableguards.symbols.ids import DEFAULT_ID_SPACE, allocate, home_slot

names = st.text(min_size=1, max_size=40)
unique_names = st.lists(names, min_size=1, max_size=200, unique=True)


def allocate_all(order: list[str], space: int = DEFAULT_ID_SPACE) -> dict[str, int]:
    taken: set[int] = set()
    ids = {}
    for name in order:
        ids[name] = allocate(name, taken, space).id
        taken.add(ids[name])
    return ids


@given(unique_names)
def test_ids_are_unique_within_a_scope(order):
    ids = allocate_all(order)
    assert len(set(ids.values())) == len(order)


@given(unique_names, st.randoms())
def test_id_depends_only_on_the_name_when_nothing_collides(order, rng):
    homes = {name: home_slot(name) for name in order}
    if len(set(homes.values())) < len(order):
        return  # a genuine clash among these names; covered by the tests below
    shuffled = order[:]
    rng.shuffle(shuffled)
    assert allocate_all(order) == homes == allocate_all(shuffled)


@given(unique_names, st.integers(1, 2_000))
def test_an_id_leaves_its_home_slot_only_when_that_slot_is_held(order, space):
    """So other sources can move an id only by actually colliding with it."""
    taken: set[int] = set()
    for name in order[:space]:
        home = home_slot(name, space)
        allocation = allocate(name, taken, space)
        assert (allocation.id == home) == (home not in taken)
        taken.add(allocation.id)


@settings(max_examples=200)
@given(st.lists(names, min_size=1, max_size=7, unique=True), st.integers(1, 7))
def test_forced_collisions_probe_to_unique_deterministic_ids(order, space):
    if len(order) > space:
        with pytest.raises(ValueError, match="taken"):
            allocate_all(order, space)
        return
    first, second = allocate_all(order, space), allocate_all(order, space)
    assert first == second
    assert len(set(first.values())) == len(order)
    assert all(0 <= id_ < space for id_ in first.values())


def test_probing_wraps_around_the_end_of_the_space():
    space = 5
    name = next(n for n in (f"n{i}" for i in range(100)) if home_slot(n, space) == space - 1)
    assert allocate(name, {space - 1}, space).id == 0
    assert allocate(name, {space - 1}, space).probes == 1


def test_allocate_only_reads_taken():
    taken = frozenset({home_slot("L['x'].size()[0]")})
    allocation = allocate("L['x'].size()[0]", taken)
    assert allocation.probes == 1 and allocation.id not in taken


def test_ids_are_identical_across_processes_with_different_hash_seeds():
    script = (
        "import json; from stableguards.symbols.ids import allocate\n"
        "taken = set(); out = []\n"
        "for i in range(300):\n"
        "    a = allocate(f\"L['x{i}'].size()[0]\", taken, 500); taken.add(a.id); out.append(a.id)\n"
        "print(json.dumps([out, hash('salt')]))\n"
    )
    results = []
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, check=True)
        results.append(json.loads(proc.stdout))
    assert len({json.dumps(ids) for ids, _ in results}) == 1
    assert len({salt for _, salt in results}) == 3  # the seeds really differed
