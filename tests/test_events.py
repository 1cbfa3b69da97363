"""The event log, and the features' messages that go through it: counters and explanations."""

from __future__ import annotations

import gc

from stableguards.backends import messages as backend_messages
from stableguards.cudagraphs import messages as cudagraph_messages
from stableguards.events import EVENTS, EventLog
from stableguards.optimizers import messages as optimizer_messages
from stableguards.symbols.ids import home_slot
from stableguards.symbols.state import SymbolIds


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
    ids = SymbolIds(id_space=50)
    first, second = colliding_pair(50)
    scope, taken = Scope(), set()
    a = ids.symbol_id(scope, first, taken)
    b = ids.symbol_id(scope, second, taken)
    assert taken == {a, b} and a == home_slot(first, 50) and b != a
    assert EVENTS.counters["symbols_allocated"] == 2
    assert EVENTS.counters["symbol_collisions"] == 1
    text = EVENTS.explain()
    assert first in text and second in text
    assert f"s{b}" in text and "cache key" in text


def test_no_collision_no_event():
    SymbolIds().symbol_id(Scope(), "L['x'].size()[0]", set())
    assert EVENTS.explain() == "stableguards: symbols_allocated=1"


def test_separate_scopes_do_not_see_each_other():
    ids = SymbolIds()
    name = "L['x'].size()[0]"
    assert ids.symbol_id(Scope(), name, set()) == ids.symbol_id(Scope(), name, set())
    assert EVENTS.counters["symbol_collisions"] == 0


def test_a_finished_scope_is_forgotten():
    ids = SymbolIds()
    scope = Scope()
    ids.symbol_id(scope, "L['x'].size()[0]", set())
    del scope
    gc.collect()
    assert len(ids._holders) == 0


def test_one_source_given_several_symbols_is_not_a_collision():
    ids = SymbolIds()
    scope, taken = Scope(), set()
    first = ids.symbol_id(scope, "<ephemeral: offsets>", taken)
    second = ids.symbol_id(scope, "<ephemeral: offsets>", taken)
    assert second == first + 1
    assert EVENTS.counters["symbol_repeats"] == 1 and EVENTS.counters["symbol_collisions"] == 0
    assert "wanted" not in EVENTS.explain()


def test_fallbacks_are_counted_explained_and_warned_once(caplog):
    log = EventLog()
    with caplog.at_level("WARNING", logger="stableguards"):
        log.fell_back("symbol ids", RuntimeError("boom"))
        log.fell_back("symbol ids", RuntimeError("boom again"))
    assert log.counters["fallbacks"] == 2
    assert "symbol ids" in log.explain() and "boom" in log.explain()
    assert len([r for r in caplog.records if "symbol ids" in r.getMessage()]) == 1


def test_events_and_warnings_remembered_are_bounded():
    log = EventLog()
    for i in range(2_000):
        log.fell_back(f"h{i}", RuntimeError(str(i)))
    assert len(log.explain().splitlines()) <= 257 and len(log._warned) <= 1024


def test_the_parts_left_to_torch_are_named():
    assert "parts left to torch (STABLEGUARDS_DISABLE): keys, symbols" in EventLog().explain({"symbols", "keys"})


def test_optimizer_and_cudagraph_events_are_counted_and_explained(caplog):
    optimizer_messages.state_guards_versioned(state_dicts=4, identity_guards=12)
    optimizer_messages.released("Adam at 0x1 (1 group(s), 4 param(s))", 3)
    with caplog.at_level("WARNING", logger="stableguards"):
        cudagraph_messages.static_inputs_moved(
            "cudagraph re-recorded (1st time) because static inputs moved: L['w'] 0x10 -> 0x20")
    assert EVENTS.counters["optimizer_state_dicts_versioned"] == 4
    assert EVENTS.counters["optimizer_identity_guards_dropped"] == 12
    assert EVENTS.counters["optimizer_entries_released"] == 3
    assert EVENTS.counters["cudagraph_rerecords"] == 1
    text = EVENTS.explain()
    assert "optimizer Adam at 0x1 (1 group(s), 4 param(s)) was collected: released 3 cache entries" in text
    assert "L['w'] 0x10 -> 0x20" in text
    assert any("L['w'] 0x10 -> 0x20" in r.getMessage() for r in caplog.records)


def test_a_backend_switch_names_the_component_that_differs():
    from stableguards.fingerprint import Fingerprinter

    class Wrapper:
        def __init__(self, options):
            self.options = options

    fp = Fingerprinter(is_torch_wrapper=lambda obj: type(obj) is Wrapper)
    new = fp.fingerprint(Wrapper({"max_autotune": True, "mode": "x"}))
    far = fp.fingerprint(Wrapper({"max_autotune": False, "mode": "y"}))
    close = fp.fingerprint(Wrapper({"max_autotune": False, "mode": "x"}))
    backend_messages.switched("f (train.py:3)", new, [far, close, "SomeBackend"])
    line = EVENTS.explain().splitlines()[-1]
    assert EVENTS.counters["backend_switches"] == 1
    assert "its code for 3 other backend(s)" in line
    assert line.endswith("differs in options['max_autotune']: True vs False")


def test_timed_blocks_count_each_second_once_by_the_innermost_name(monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 10.0])  # outer starts, inner starts, inner ends, outer ends
    monkeypatch.setattr("stableguards.events.time.perf_counter", lambda: next(clock))
    log = EventLog()
    with log.timed("outer"), log.timed("inner"):
        pass
    assert log.seconds == {"outer": 8.0, "inner": 2.0}
    log.reset()
    assert not log.seconds
