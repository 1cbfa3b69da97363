"""Explaining FX-graph cache misses by diffing key components."""

from __future__ import annotations

import json

from stableguards.keys.ledger import KeyLedger, KeyRecord, differences, nearest

CODE = "<lambda>()\n\ndef forward(self, arg0_1, arg1_1):\n    mul = torch.ops.aten.mul.Tensor(arg1_1, {s})\n    return (mul,)"


def record(key: str, symbol: str, debug: bool = False) -> KeyRecord:
    lines = [
        f"[g-{symbol}] gm: {CODE.format(s=symbol)}",
        f"[e-{symbol}] example_inputs[0]: ('{symbol}',)",
        "[t] torch_version: 2.13",
        f"[c-{debug}] inductor_config[debug]: {debug}",
    ]
    return KeyRecord.from_debug_lines(key, lines)


def test_components_are_parsed_with_multiline_values():
    rec = record("k1", "s68")
    assert rec.hashes.get("example_inputs[0]") == "e-s68" and rec.values["example_inputs[0]"] == "('s68',)"
    assert rec.values["gm"].count("\n") == 4


def test_nearest_shares_the_most_components_and_is_never_itself():
    new = record("new", "s69")
    same_symbol_other_config = record("a", "s69", debug=True)
    other_symbol = record("b", "s68")
    assert nearest(new, [new, other_symbol, same_symbol_other_config]) is same_symbol_other_config
    assert nearest(new, [new]) is None


def test_differences_name_the_component_and_the_symbol():
    diffs = differences(record("new", "s69"), record("old", "s68"))
    assert "example_inputs[0]: ('s68',) -> ('s69',)" in diffs
    gm = next(d for d in diffs if d.startswith("gm:"))
    assert "line 4" in gm and "s68" in gm and "s69" in gm
    assert not any(d.startswith("torch_version") for d in diffs)


def test_ledger_round_trip_skips_unreadable_files(tmp_path):
    ledger = KeyLedger(tmp_path)
    ledger.record(record("k1", "s68"))
    ledger.record(record("k1", "s99"))  # a key is recorded once
    (tmp_path / "broken.json").write_text("{not json")
    [only] = ledger.recent()
    assert only == record("k1", "s68")


def test_the_same_graph_under_another_key_is_preferred():
    """A graph that differs only in its symbols beats another graph with the same symbols."""
    new = KeyRecord.from_debug_lines("new", ["[G] gm: same code", "[a69] example_inputs[0]: ('s69',)",
                                             "[b69] example_inputs[1]: shape=[s69]", "[t] torch_version: x"])
    same_graph = KeyRecord.from_debug_lines("old1", ["[G] gm: same code", "[a68] example_inputs[0]: ('s68',)",
                                                     "[b68] example_inputs[1]: shape=[s68]", "[t] torch_version: x"])
    other_graph = KeyRecord.from_debug_lines("old2", ["[H] gm: other code", "[a69] example_inputs[0]: ('s69',)",
                                                      "[b69] example_inputs[1]: shape=[s69]", "[t] torch_version: x"])
    assert nearest(new, [other_graph, same_graph]) is same_graph


def test_a_difference_deep_in_a_long_value_is_shown():
    prefix = "TensorMetadata(dtype=torch.float32, " + "x" * 300
    new = KeyRecord.from_debug_lines("n", [f"[1] example_inputs[1]: {prefix} shape=[s69])"])
    old = KeyRecord.from_debug_lines("o", [f"[2] example_inputs[1]: {prefix} shape=[s68])"])
    [line] = differences(new, old)
    assert "s68" in line and "s69" in line and line.count("...") == 2


def test_the_ledger_is_bounded_and_evicts_the_least_recently_used(tmp_path):
    import os
    import time

    ledger = KeyLedger(tmp_path, capacity=3)
    for age, key in ((30, "a"), (20, "b"), (10, "c")):
        ledger.record(KeyRecord.from_debug_lines(key, [f"[h] c: {key}"]))
        past = time.time() - age
        os.utime(tmp_path / f"{key}.json", (past, past))
    ledger.record(KeyRecord.from_debug_lines("a", []))  # used again: now the most recent
    ledger.record(KeyRecord.from_debug_lines("d", []))  # one too many: the least recently used goes
    assert sorted(r.key for r in ledger.recent()) == ["a", "c", "d"]


def test_the_shared_ledger_keeps_the_most_recent_keys_newest_first(tmp_path):
    """The ledger in a shared store: another process (another machine) reads what was recorded."""
    from stableguards.keys.ledger import SharedKeyLedger
    from stableguards.storage.engines import DirectoryEngine

    engine = DirectoryEngine(tmp_path)
    ledger = SharedKeyLedger(engine, capacity=3)
    for key in ("a", "b", "c", "a", "d"):
        ledger.record(KeyRecord.from_debug_lines(key, [f"[h{key}] c: {key}"]))
    assert [r.key for r in SharedKeyLedger(engine).recent()] == ["d", "a", "c"]  # b fell off the end
    assert SharedKeyLedger(engine).recent()[1] == KeyRecord.from_debug_lines("a", ["[ha] c: a"])
    engine.put("fx_keys/c", b"{not json")  # an unreadable record is skipped
    engine.put(SharedKeyLedger.RECENT, json.dumps(["d", "../../etc", "c", 7]).encode())  # names checked
    assert [r.key for r in ledger.recent()] == ["d"]
    engine.put(SharedKeyLedger.RECENT, b"garbage")
    assert ledger.recent() == []
    ledger.record(KeyRecord.from_debug_lines("e", []))  # and it starts again
    assert [r.key for r in ledger.recent()] == ["e"]


def test_components_that_print_the_same_are_said_to_and_a_key_with_none_differing_says_where_it_differs():
    from stableguards.events import EVENTS
    from stableguards.keys import messages

    new = KeyRecord.from_debug_lines("new", ["[1] a: x", "[2] b: same", "[3] c: same"])
    old = KeyRecord.from_debug_lines("old", ["[9] a: y", "[8] b: same", "[3] c: same"])
    assert differences(new, old) == ["a: y -> x", "1 more whose hashes differ but that print the same (b)"]
    EVENTS.reset()
    messages.fx_cache_miss("k" * 20, "n" * 20, [])
    assert "the same components as inductor prints them" in EVENTS.explain()
