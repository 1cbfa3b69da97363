from __future__ import annotations


import pytest
import torch

from stableguards.cudagraphs.checks import (
    Moved,
    StaticInputMoved,
    StaticInputWatch,
    copied_grads_message,
)


class Buf:
    """A stand-in tensor whose address the test sets."""

    def __init__(self, addr: int) -> None:
        self.addr = addr


def watch() -> StaticInputWatch:
    return StaticInputWatch(address_of=lambda b: b.addr)


def recorded(graph="g", names=("L['w']", "L['b']", "L['x']")):
    w = watch()
    inputs = [Buf(0x7F00), Buf(0x7F40), Buf(0x9000)]
    w.record(graph, inputs, static_indices=[0, 1], names=list(names))
    return w, inputs


def test_nothing_moved_gives_no_report():
    w, inputs = recorded()
    assert w.check("g", inputs) is None


def test_report_names_the_moved_source_with_old_and_new_address():
    w, inputs = recorded()
    inputs[0].addr = 0x7F80
    report = w.check("g", inputs)
    assert report.graph == "g"
    assert report.moved == (Moved("L['w']", 0, 0x7F00, 0x7F80),)
    assert report.rerecords == 1
    text = report.describe()
    assert "L['w'] 0x7f00 -> 0x7f80" in text
    assert "(1st time)" in text
    assert "mark_static_address" in text and "copy_" in text


def test_rerecords_count_up_and_addresses_update_after_a_report():
    w, inputs = recorded()
    inputs[0].addr = 0x7F80
    assert w.check("g", inputs).rerecords == 1
    assert w.check("g", inputs) is None
    inputs[0].addr = 0x8000
    second = w.check("g", inputs)
    assert second.rerecords == 2
    assert second.moved == (Moved("L['w']", 0, 0x7F80, 0x8000),)
    assert "(2nd time)" in second.describe()


def test_recording_again_keeps_the_rerecord_count():
    w, inputs = recorded()
    inputs[0].addr = 0x7F80
    w.check("g", inputs)
    w.record("g", inputs, [0, 1], ["L['w']", "L['b']"])
    inputs[1].addr = 0x1
    assert w.check("g", inputs).rerecords == 2


def test_every_moved_input_is_listed():
    w, inputs = recorded()
    inputs[0].addr, inputs[1].addr = 0x1, 0x2
    assert [m.name for m in w.check("g", inputs).moved] == ["L['w']", "L['b']"]


def test_non_static_inputs_moving_are_ignored():
    w, inputs = recorded()
    inputs[2].addr = 0x1234
    assert w.check("g", inputs) is None


def test_unknown_graph_gives_none():
    w, inputs = recorded()
    inputs[0].addr = 0x1
    assert w.check("other", inputs) is None


def test_strict_raises_and_changes_nothing():
    w, inputs = recorded()
    inputs[0].addr = 0x7F80
    with pytest.raises(StaticInputMoved) as info:
        w.check("g", inputs, strict=True)
    assert "L['w'] 0x7f00 -> 0x7f80" in str(info.value)
    assert "re-recorded 0 time(s) before" in str(info.value)
    assert info.value.report.moved == (Moved("L['w']", 0, 0x7F00, 0x7F80),)
    # No re-record happened: the old address is still the recorded one.
    with pytest.raises(StaticInputMoved):
        w.check("g", inputs, strict=True)
    assert w.check("g", inputs).rerecords == 1


def test_missing_names_fall_back_to_the_index():
    w, inputs = recorded(names=["L['w']"])
    inputs[0].addr, inputs[1].addr = 0x1, 0x2
    assert [m.name for m in w.check("g", inputs).moved] == ["L['w']", "input 1"]


def test_forget_drops_the_graph():
    w, inputs = recorded()
    w.forget("g")
    w.forget("never recorded")
    inputs[0].addr = 0x1
    assert w.check("g", inputs) is None


def test_the_table_is_bounded_keeping_the_most_recent_graphs():
    w = StaticInputWatch(address_of=lambda b: b.addr, capacity=2)
    inputs = [Buf(0x10), Buf(0x20)]
    for graph in ("a", "b", "c"):
        w.record(graph, inputs, [0], ["w", "x"])
    assert len(w) == 2
    inputs[0].addr = 0x1
    assert w.check("a", inputs) is None  # evicted
    assert w.check("c", inputs) is not None


def test_copied_grads_message_names_the_grads():
    text = copied_grads_message(["L['w'].grad", "L['b'].grad"])
    assert "L['w'].grad, L['b'].grad" in text
    assert "copied" in text
    assert "stableguards.static_grads(opt)" in text
    assert "more" not in text


def test_copied_grads_message_shortens_a_long_list():
    text = copied_grads_message([f"p{i}.grad" for i in range(10)])
    assert "p0.grad, p1.grad, p2.grad and 7 more" in text
    assert "p3.grad" not in text


def test_real_tensors_rebinding_moves_and_copy_in_place_does_not():
    name = "L['self'].param_groups[0]['params'][0]"
    w = StaticInputWatch()
    param, x = torch.zeros(4), torch.ones(4)
    w.record("g", [param, x], [0], [name])
    param.copy_(torch.full((4,), 2.0))
    assert w.check("g", [param, x]) is None
    old = param.data_ptr()
    rebound = param.clone()
    assert w.check("g", [rebound, x]).moved == (Moved(name, 0, old, rebound.data_ptr()),)
    # Rebinding a parameter's storage (p.data = ...) moves it too.
    rebound.data = rebound.data.clone()
    assert w.check("g", [rebound, x]).rerecords == 2


class StandInNode:
    """Behaves as torch's CUDAGraphNode does at the hook points, on CPU."""

    def __init__(self, wrapped_function, id, parent, inputs, cuda_graphs_pool, device_index,
                 stack_traces, stream, mode, compile_id):
        self.wrapped_function = wrapped_function
        self.tensor_static_input_idxs = [0]
        inputs.clear()  # as torch does: the node takes over its inputs

    def check_invariants(self, inputs):
        from torch._inductor.cudagraph_trees import CheckInvariantStatus

        return CheckInvariantStatus.StaticInputIdxMismatch, None


def test_cudagraph_hooks_name_the_moved_input_and_strict_refuses(caplog):
    """The hooks in stableguards.cudagraphs.hooks, through the fail-open wrapper, on a stand-in
    that consumes its inputs as torch's node does (the addresses must be taken before)."""
    import logging
    from types import SimpleNamespace

    import torch

    import stableguards
    from stableguards.cudagraphs import hooks as cudagraphs
    from stableguards.events import EVENTS
    from stableguards.hooks.core import _wrap

    hooks = {h.target: h for h in cudagraphs.HOOKS}
    init = _wrap(hooks["CUDAGraphNode.__init__"], StandInNode.__init__)
    check = _wrap(hooks["CUDAGraphNode.check_invariants"], StandInNode.check_invariants)
    function = SimpleNamespace(id="fn-7", placeholders=[SimpleNamespace(name="primals_1"),
                                                         SimpleNamespace(name="primals_2")])
    weight, x = torch.zeros(2), torch.zeros(2)
    node = StandInNode.__new__(StandInNode)
    with torch._dynamo.config.patch(stable_guards=True), caplog.at_level(logging.WARNING, "stableguards"):
        init(node, function, 0, None, [weight, x], None, 0, None, None, None, compile_id="c0")
        assert EVENTS.counters["fallbacks"] == 0
        check(node, [weight.clone(), x])
        assert any("primals_1" in r.getMessage() and "1st time" in r.getMessage() for r in caplog.records)
        stableguards.cudagraphs.strict_static_inputs = True
        try:
            with pytest.raises(StaticInputMoved, match="primals_1"):
                check(node, [weight.clone(), x])
        finally:
            stableguards.cudagraphs.strict_static_inputs = False


def test_input_names_match_flat_inputs_by_number_not_position():
    """Placeholder order is inductor's (an H100 run recorded primals_2, primals_3, primals_1);
    the number in the name is AOTAutograd's flat input."""
    from stableguards.cudagraphs.checks import input_names

    sources = ["L['w']", "L['b']", "L['x']"]
    assert input_names(["primals_2", "primals_3", "primals_1"], sources) == [
        "L['b'] (primals_2)", "L['x'] (primals_3)", "L['w'] (primals_1)"]
    # A backward graph: tangents and saved activations keep their names.
    assert input_names(["tangents_1", "addmm", "primals_3"], sources) == [
        "tangents_1", "addmm", "L['x'] (primals_3)"]
    assert input_names(["arg2_1", "arg0_1", "arg9_1"], sources) == [
        "L['x'] (arg2_1)", "L['w'] (arg0_1)", "arg9_1"]
    assert input_names(["arg0_1"], None) == ["arg0_1"]


def test_resetting_the_trees_forgets_recordings():
    """torch's function ids start again after reset_cudagraph_trees (seen on an H100):
    a new graph with an old id must not inherit the old graph's addresses or count."""
    import torch

    from stableguards.cudagraphs import hooks as cudagraphs
    from stableguards.cudagraphs.state import STATE
    from stableguards.hooks.core import _wrap

    hook = next(h for h in cudagraphs.HOOKS if h.target == "reset_cudagraph_trees")
    reset = _wrap(hook, lambda: None)
    STATE.static_inputs.record(0, [torch.zeros(1)], [0], ["w"])
    with torch._dynamo.config.patch(stable_guards=True):
        reset()
    assert len(STATE.static_inputs) == 0
