"""Warm start's plain rules for saving an entry's guards, without Dynamo: which check each guard
is saved as (``warm_start.saving``) and how the guard state is pickled (``warm_start.pickling``),
each through ``pickle`` alone, round trip included."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from stableguards.warm_start import pickling, saving


def _local_adder(k):
    def add(x):
        return x + k
    return add


class _Pickler(pickle.Pickler):
    """A pickler that applies warm start's rules, as torch's guard pickler does for our entries."""

    guard_tree_values: dict = {}

    def reducer_override(self, obj):
        return pickling.reduce(obj, lambda: NotImplemented, self)


def _round_trip(obj):
    buffer = io.BytesIO()
    _Pickler(buffer).dump(obj)
    return pickle.loads(buffer.getvalue())


def test_a_local_functions_code_comes_back_as_the_code_live_functions_run():
    code = _local_adder(1).__code__
    assert _round_trip(code) is code  # by its path: an id check on fn.__code__ passes in another process
    assert pickling.reduce(code, lambda: "torch's", None)[0].__name__ == "code_at"


def test_code_with_no_path_is_left_to_torch():
    code = compile("x + 1", "<made>", "eval")
    assert pickling.reduce(code, lambda: "torch's", None) == "torch's"


def test_an_optimizer_comes_back_as_what_it_holds_without_its_setstate():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.5, momentum=0.9)
    rebuilt = _round_trip(optimizer)
    assert type(rebuilt) is torch.optim.SGD and rebuilt.defaults == optimizer.defaults
    assert rebuilt.param_groups[0]["lr"] == 0.5


def test_a_view_keeps_its_layout_where_torch_would_save_it_dense():
    base = torch.zeros(4, 4, device="meta")
    view = base[1:, ::2]

    def dense():  # torch's reduction of a tensor: its function's name is what the rule recognizes
        return _unpickle_tensor, (torch.empty_like(view, device="meta"),)

    reduced = pickling.reduce(view, dense, None)
    rebuilt = reduced[0](*reduced[1])
    assert rebuilt.stride() == view.stride() and rebuilt.storage_offset() == view.storage_offset()
    assert rebuilt.shape == view.shape


def _unpickle_tensor(meta):
    return meta


def test_a_parametrized_module_and_its_class_come_back_as_torch_makes_them():
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return w * 2

    layer = torch.nn.Linear(2, 2)
    parametrize.register_parametrization(layer, "weight", Double())
    cls = type(layer)
    reduced = pickling.reduce(cls, lambda: NotImplemented, None)
    made = reduced[0](*reduced[1])
    assert made is not cls and made.__bases__ == (torch.nn.Linear,) and made.__qualname__ == cls.__qualname__
    assert {n for n, v in vars(made).items() if isinstance(v, property)} == {"weight"}
    module = pickling.reduce(layer, lambda: NotImplemented, None)
    rebuilt = module[0](*module[1])
    module[5](rebuilt, module[2])
    assert torch.equal(rebuilt.weight, layer.weight)


def test_anything_else_is_torchs_reduction():
    assert pickling.reduce([1, 2], lambda: "torch's", None) == "torch's"
    pickler = type("P", (), {"guard_tree_values": {}})()
    assert pickling.reduce(object(), lambda: NotImplemented, pickler) is NotImplemented


@pytest.mark.parametrize("kind, types_, expected", [
    ("MODULE_MATCH", {"MODULE_MATCH"}, "MODULE_BY_NAME"),
    ("CLASS_MATCH", {"CLASS_MATCH", "ID_MATCH"}, "CLASS_BY_NAME"),
    ("CLOSURE_MATCH", {"CLOSURE_MATCH"}, "CLOSURE_BY_NAME"),
    ("CLOSURE_MATCH", {"CLOSURE_MATCH", "ID_MATCH"}, None),  # must not fall back to an id check
    ("CONSTANT_MATCH", {"CONSTANT_MATCH"}, "CONSTANT_BY_NAME"),
    ("ID_MATCH", {"ID_MATCH", "TYPE_MATCH"}, None),
    ("EQUALS_MATCH", {"EQUALS_MATCH"}, None),
    ("TENSOR_MATCH", {"TENSOR_MATCH"}, None),
])
def test_an_identity_guard_is_saved_by_name_and_nothing_else_is_replaced(kind, types_, expected):
    assert saving.replacement(kind, frozenset(types_), "G['x']", lambda: len, frozenset(), frozenset(), set()) \
        == expected


def test_an_id_check_on_what_no_name_finds_is_bound_on_the_first_call():
    param = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    ids = frozenset({"ID_MATCH"})

    def rule(obj, source="L['x']", bound=frozenset(), held=()):
        return saving.replacement("ID_MATCH", ids, source, lambda: obj, bound, frozenset(), set(held))

    assert rule(optimizer) == "ID_ON_FIRST_CALL"  # its identity is its state
    assert rule(param) == "ID_ON_FIRST_CALL"  # a tensor no graph holds
    assert rule(param, held={id(param)}) == "ID_BY_NAME"  # a graph holds it under another source: fails the proof
    assert rule(param, bound=frozenset({"L['x']"}), held={id(param)}) == "ID_ON_FIRST_CALL"  # the graph takes it here
    assert rule(len) == "ID_BY_NAME"
    assert saving.replacement("DICT_VERSION", frozenset({"DICT_VERSION"}), "S", lambda: {}, frozenset(),
                              frozenset({"S"}), set()) == "VERSION_ON_FIRST_CALL"
    assert saving.replacement("DICT_VERSION", frozenset({"DICT_VERSION"}), "S", lambda: {}, frozenset(),
                              frozenset(), set()) is None


def test_a_type_check_on_a_parametrized_class_is_bound_on_the_first_call():
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return w * 2

    layer = torch.nn.Linear(2, 2)
    type_match = frozenset({"TYPE_MATCH"})
    assert saving.replacement("TYPE_MATCH", type_match, "L['m']", lambda: layer, frozenset(), frozenset(), set()) \
        is None
    parametrize.register_parametrization(layer, "weight", Double())
    assert saving.replacement("TYPE_MATCH", type_match, "L['m']", lambda: layer, frozenset(), frozenset(), set()) \
        == "TYPE_ON_FIRST_CALL"


def test_every_name_the_rule_gives_is_a_rebuilt_check():
    from stableguards.warm_start.hooks import rebuilt_checks

    names = {*saving.BY_NAME.values(), "ID_ON_FIRST_CALL", "VERSION_ON_FIRST_CALL", "TYPE_ON_FIRST_CALL"}
    assert all(callable(getattr(rebuilt_checks, name)) for name in names)
