"""The profile data model: the merge is a semilattice join, JSON round-trips, bad JSON is named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stableguards.profiles.profile import (
    DYNAMIC,
    UNSET,
    VARIED,
    CodeKey,
    Dim,
    Profile,
    ProfileError,
    SourceEntry,
    State,
    dumps,
    from_json,
    specialized,
    static,
    to_json,
)
from stableguards.profiles.session import handed_on

dims = st.one_of(
    st.just(UNSET), st.just(VARIED), st.just(DYNAMIC),
    st.builds(static, st.integers(0, 4) | st.sampled_from(["S(0)", "S(1)"])),
    st.builds(specialized, st.sampled_from(["range_refined_to_singleton", "solve"])),
)
dim_tuples = st.one_of(st.just(UNSET), st.just(DYNAMIC), st.lists(dims, min_size=1, max_size=3).map(tuple))
entries = st.builds(SourceEntry, dims, dim_tuples, dim_tuples)
codes = st.builds(CodeKey, st.sampled_from(["aa", "bb"]), st.integers(1, 3), st.sampled_from(["f", "g"]),
                  st.sampled_from([None, "c1"]), st.just("x.py"))
profiles = st.dictionaries(codes, st.dictionaries(st.sampled_from(["L['x']", "L['n']", "L['d']['k']"]),
                                                  entries, max_size=3), max_size=3).map(Profile)


@given(dims, dims)
def test_dim_join_is_commutative(a, b):
    assert a | b == b | a


@given(dims, dims, dims)
def test_dim_join_is_associative(a, b, c):
    assert (a | b) | c == a | (b | c)


@given(dims)
def test_dim_join_is_idempotent_with_unset_as_identity(a):
    assert a | a == a and a | UNSET == a


@given(profiles, profiles, profiles)
def test_profile_join_is_a_semilattice(a, b, c):
    assert a | b == b | a
    assert (a | b) | c == a | (b | c)
    assert a | a == a
    assert a <= a | b and b <= a | b


def test_the_order_of_states():
    assert static(3) | static(3) == static(3)
    assert static(3) | static(4) == VARIED
    assert VARIED | specialized("solve") == specialized("solve")
    assert specialized("solve") | DYNAMIC == DYNAMIC
    assert specialized("a") | specialized("b") == specialized("a", "b")


def test_rank_change_makes_every_size_dynamic():
    a = SourceEntry(DYNAMIC, (static(2),), (static(1),))
    b = SourceEntry(DYNAMIC, (static(2), static(3)), (static(3), static(1)))
    assert (a | b).size == DYNAMIC


def test_what_the_next_process_starts_from():
    assert handed_on(specialized("range_refined_to_singleton")) == UNSET
    assert handed_on(VARIED) == DYNAMIC
    assert handed_on(DYNAMIC) == DYNAMIC
    assert handed_on(static(5)) == static(5)


@given(profiles)
def test_json_round_trip(profile):
    assert from_json(json.loads(dumps(profile))) == profile
    assert json.loads(dumps(profile)) == to_json(profile)


def test_one_source_per_line():
    text = dumps(Profile({CodeKey("ab", 3, "f", None, "x.py"): {
        "L['x']": SourceEntry(DYNAMIC, (DYNAMIC,), (static(1),)),
        "L['y']": SourceEntry(DYNAMIC, (static(2),), (static(1),))}}))
    lines = text.splitlines()
    assert any(line.strip().startswith('"L[\'x\']"') for line in lines)
    assert any(line.strip().startswith('"L[\'y\']"') for line in lines)


GOOD = to_json(Profile({CodeKey("ab", 3, "f", None, "x.py"): {"L['x']": SourceEntry(DYNAMIC, (static(2),), (static(1),))}}))


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.update(format="pickle"), "not a stableguards-pgo profile"),
    (lambda d: d.update(version=0), "version 0"),
    (lambda d: d.update(frames={}), "frames must be list"),
    (lambda d: d["frames"][0]["code"].update(firstlineno="3"), "frames[0].code.firstlineno"),
    (lambda d: d["frames"][0]["sources"]["L['x']"].update(size=["huge"]), "frames[0].sources[\"L['x']\"].size[0]"),
    (lambda d: d["frames"][0]["sources"]["L['x']"].update(scalar={"static": True}), ".scalar"),
    (lambda d: d["frames"][0]["sources"]["L['x']"].update(stride=[{"static": "os.system"}]), ".stride[0]"),
])
def test_schema_errors_name_the_bad_part(mutate, where):
    data = json.loads(json.dumps(GOOD))
    mutate(data)
    with pytest.raises(ProfileError) as error:
        from_json(data)
    assert where in str(error.value)


def test_state_names_are_readable():
    entry = SourceEntry(DYNAMIC, (specialized("solve"), DYNAMIC, static(4)), (static("S(1)"), static(1)))
    assert str(entry) == "size=[specialized(solve), dynamic, 4] stride=[S(1), 1]"
    assert str(SourceEntry(static(3), DYNAMIC, DYNAMIC)) == "scalar 3"
    assert Dim(State.VARIED).state.name == "VARIED"
