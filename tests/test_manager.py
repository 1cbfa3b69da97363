"""The guard manager's allocation bookkeeping, counters and explanations."""

from __future__ import annotations

import gc

from stableguards.manager import GuardManager
from stableguards.symbols import home_slot


class Scope:
    """Stands in for a ShapeEnv: anything weak-referenceable."""


def colliding_pair(space: int) -> tuple[str, str]:
    seen: dict[int, str] = {}
    for i in range(10_000):
        name = f"L['t{i}'].size()[0]"
        slot = home_slot(name, space)
        if slot in seen:
            return seen[slot], name
        seen[slot] = name
    raise AssertionError("no pair found")


def test_counts_and_explains_a_collision_by_source_and_symbol():
    manager = GuardManager(id_space=50)
    first, second = colliding_pair(50)
    scope, taken = Scope(), set()
    a = manager.symbol_id(scope, first, taken)
    b = manager.symbol_id(scope, second, taken)
    assert taken == {a, b} and a == home_slot(first, 50) and b != a
    assert manager.counters["symbols_allocated"] == 2
    assert manager.counters["symbol_collisions"] == 1
    text = manager.explain()
    assert first in text and second in text
    assert f"s{b}" in text and "cache key" in text


def test_no_collision_no_event():
    manager = GuardManager()
    manager.symbol_id(Scope(), "L['x'].size()[0]", set())
    assert manager.explain() == "stableguards: symbols_allocated=1"


def test_separate_scopes_do_not_see_each_other():
    manager = GuardManager()
    name = "L['x'].size()[0]"
    assert manager.symbol_id(Scope(), name, set()) == manager.symbol_id(Scope(), name, set())
    assert manager.counters["symbol_collisions"] == 0


def test_a_finished_scope_is_forgotten():
    manager = GuardManager()
    scope = Scope()
    manager.symbol_id(scope, "L['x'].size()[0]", set())
    del scope
    gc.collect()
    assert len(manager._holders) == 0


def test_fallbacks_are_counted_and_explained():
    manager = GuardManager()
    manager.record_fallback("symbol ids", RuntimeError("boom"))
    assert manager.counters["fallbacks"] == 1
    assert "symbol ids" in manager.explain() and "boom" in manager.explain()


def test_events_are_bounded():
    manager = GuardManager()
    for i in range(2_000):
        manager.record_fallback("h", RuntimeError(str(i)))
    assert len(manager.explain().splitlines()) <= 257


def test_one_source_given_several_symbols_is_not_a_collision():
    manager = GuardManager()
    scope, taken = Scope(), set()
    first = manager.symbol_id(scope, "<ephemeral: offsets>", taken)
    second = manager.symbol_id(scope, "<ephemeral: offsets>", taken)
    assert second == first + 1
    assert manager.counters["symbol_repeats"] == 1 and manager.counters["symbol_collisions"] == 0
    assert "wanted" not in manager.explain()


def test_optimizer_and_cudagraph_events_are_counted_and_explained(caplog):
    manager = GuardManager()
    manager.note_optimizer_guards(state_dicts=4, identity_guards=12)
    manager.note_optimizer_released("Adam at 0x1 (1 group(s), 4 param(s))", 3)
    with caplog.at_level("WARNING", logger="stableguards"):
        manager.note_static_inputs_moved("cudagraph re-recorded (1st time) because static inputs moved: L['w'] 0x10 -> 0x20")
    assert manager.counters["optimizer_state_dicts_versioned"] == 4
    assert manager.counters["optimizer_identity_guards_dropped"] == 12
    assert manager.counters["optimizer_entries_released"] == 3
    assert manager.counters["cudagraph_rerecords"] == 1
    text = manager.explain()
    assert "optimizer Adam at 0x1 (1 group(s), 4 param(s)) was collected: released 3 cache entries" in text
    assert "L['w'] 0x10 -> 0x20" in text
    assert any("L['w'] 0x10 -> 0x20" in r.getMessage() for r in caplog.records)


def test_a_backend_switch_names_the_component_that_differs():
    from stableguards.backend_match import Fingerprinter

    class Wrapper:
        def __init__(self, options):
            self.options = options

    fp = Fingerprinter(is_torch_wrapper=lambda obj: type(obj) is Wrapper)
    manager = GuardManager()
    new = fp.fingerprint(Wrapper({"max_autotune": True, "mode": "x"}))
    far = fp.fingerprint(Wrapper({"max_autotune": False, "mode": "y"}))
    close = fp.fingerprint(Wrapper({"max_autotune": False, "mode": "x"}))
    manager.note_backend_switch("f (train.py:3)", new, [far, close, "SomeBackend"])
    line = manager.explain().splitlines()[-1]
    assert manager.counters["backend_switches"] == 1
    assert "its code for 3 other backend(s)" in line
    assert line.endswith("differs in options['max_autotune']: True vs False")
