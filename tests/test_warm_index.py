"""The miss index (``warm_start.index``), without Dynamo: a miss names the components that changed
since the function's last saved key; nothing saved, the same key or an unreadable record names
nothing."""

from __future__ import annotations

from stableguards.components import Components
from stableguards.warm_start.index import changed_components, differences, index_path, record, saved_key, write_index


def _key(backend: str) -> Components:
    return Components((("module", "m"), ("qualname", "f"), ("receiver", "-"), ("backend", backend)))


def test_a_miss_names_what_changed_since_the_last_saved_key(tmp_path):
    code = _key.__code__
    assert changed_components(tmp_path, _key("a"), code) is None  # cold: nothing to explain
    write_index(tmp_path, _key("a"), code)
    assert changed_components(tmp_path, _key("a"), code) is None  # the same key
    assert changed_components(tmp_path, _key("b"), code) == ["backend: b vs a"]
    index_path(tmp_path, _key("a"), code).write_bytes(b"\xff not json")
    assert changed_components(tmp_path, _key("b"), code) is None


def test_a_record_round_trips_and_a_broken_one_is_none():
    assert saved_key(record(_key("a"))) == _key("a")
    assert saved_key(b"{") is None
    assert differences(_key("b"), None) is None
    assert differences(_key("b"), _key("a")) == ["backend: b vs a"]
