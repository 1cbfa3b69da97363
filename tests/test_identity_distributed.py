"""The identity rules for what distributed training puts in guards (stableguards.identity.distributed):
plain checks on the real objects, no Dynamo."""

from __future__ import annotations

import contextvars

import pytest
import torch

from stableguards.identity.objects import identity


def test_a_config_context_var_is_its_path_and_its_value():
    import torch.compiler.config as config

    entry = config._config.get("compile_on_one_rank")
    if entry is None or not isinstance(getattr(entry, "user_override", None), contextvars.ContextVar):
        pytest.skip("this torch keeps no ContextVar in its config")
    var = entry.user_override
    unset = identity(var)
    assert unset == "contextvar:torch.compiler.config.compile_on_one_rank.user_override=bool:False"
    token = var.set(False)
    try:
        assert identity(var) == unset  # set to what the default is: the value code reads is the same
    finally:
        var.reset(token)
    with config.patch(compile_on_one_rank=True):
        assert identity(var) == unset.replace("bool:False", "bool:True")  # another value: another identity
    assert identity(contextvars.ContextVar("compile_on_one_rank")) is None  # a look-alike no config holds


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_process_group_is_its_backend_size_ranks_and_name():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        world = identity(dist.group.WORLD)
        assert world == "process_group:gloo:size=1:ranks=[0]:name=0:desc=default_pg:hooks=False"
        other = dist.new_group([0])
        assert identity(other) not in (None, world)  # the same ranks, another group
    finally:
        dist.destroy_process_group()
    assert identity(dist.group.WORLD) == "NoneType:None"  # no group any more: none is described


class Block(torch.nn.Module):
    def forward(self, x):
        return x


class Other(torch.nn.Module):
    def forward(self, x):
        return x + 1


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_the_class_fully_shard_makes_is_told_by_what_it_wraps_and_found_again_through_torchs_map():
    import pickle

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from stableguards.warm_start.pickling import reduce, wrapper_class_at

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        block, other = fully_shard(Block()), fully_shard(Other())
        described = identity(type(block))
        assert described.startswith("wrapper:torch.distributed.fsdp._fully_shard._fully_shard.cls_to_fsdp_cls[")
        assert identity(Block) in described and described != identity(type(other))
        assert identity(type(fully_shard(Block()))) == described  # one class per wrapped class
        rebuild, args = reduce(type(block), lambda: NotImplemented, None)
        assert rebuild(*pickle.loads(pickle.dumps(args))) is type(block)  # found through the map
        missing = wrapper_class_at(args[0], args[1], torch.nn.Linear)  # nothing wrapped it yet
        assert not isinstance(block, missing) and identity(missing) is None
        lookalike = type("FSDPBlock", type(block).__bases__, {})  # the same bases, not torch's
        assert identity(lookalike) is None
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_module_fully_shard_wrapped_is_saved_as_an_instance_of_its_class():
    """FSDPModule.__new__ makes an instance of the wrapped class: pickled as is, a sharded
    module comes back as a plain one, and a check on its class never passes."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from stableguards.warm_start.pickling import reduce

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        block = fully_shard(Block())
        rebuild, args, *_ = reduce(block, lambda: NotImplemented, None)
        assert type(rebuild(*args)) is type(block)  # made bare; pickle sets its state next
        assert type(type(block)(*())) is Block  # what pickle's default would have made
    finally:
        dist.destroy_process_group()



@pytest.fixture
def one_rank():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_device_mesh_is_its_ranks_layout_names_and_groups(one_rank):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    described = identity(mesh)
    assert described.startswith("device_mesh(cpu:ranks=[0]:") and "process_group:gloo:size=1:ranks=[0]" in described
    assert identity(init_device_mesh("cpu", (1,))) == described  # equal by value, as DeviceMesh.__eq__ says
    named = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    assert named == named and identity(named) not in (None, described)
    assert "names=('tp',)" in identity(named)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_placements_are_told_by_their_fields_and_nothing_set_on_them_besides():
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

    assert identity(Shard(0)) == "torch.distributed.tensor.placement_types.Shard:Shard(dim=0)"
    assert len({identity(p) for p in (Shard(0), Shard(1), Replicate(), Partial("sum"), Partial("avg"))}) == 5
    assert identity(_StridedShard(0, split_factor=2)) is None  # fields its repr may not show: no identity
    marked = Shard(0)
    marked.extra = 1
    assert identity(marked) is None


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_dtensor_spec_is_written_by_what_torchs_spec_guard_compares(one_rank):
    """Two specs have one description only if torch's DTENSOR_SPEC_MATCH check
    (``_check_equals`` with shapes skipped) finds them equal: the rule's description is at
    least as fine as the check, so a loaded check that passed on the spec written is the
    cold one's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    from stableguards.identity.distributed import dtensor_spec, opaque_guarded

    meshes = [init_device_mesh("cpu", (1,)), init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))]
    specs = [DTensor.from_local(torch.zeros(shape, dtype=dtype), mesh, [placement])._spec
             for mesh in meshes for placement in (Shard(0), Shard(1), Replicate(), Partial())
             for dtype in (torch.float32, torch.bfloat16) for shape in ((2, 3), (4, 3))]
    for a in specs:
        for b in specs:
            same = dtensor_spec(a) == dtensor_spec(b)
            assert same == a._check_equals(b, skip_shapes=True), (a, b)
    assert dtensor_spec(meshes[0]) is None and opaque_guarded(specs[0]) is None
    assert opaque_guarded(meshes[0]) == identity(meshes[0])


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_the_spec_guards_fact_is_the_spec_at_its_source_and_nothing_else_is_one(one_rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Shard

    from stableguards.warm_start.guard_rules import Fact, Unprovable, fact

    spec = DTensor.from_local(torch.zeros(2), init_device_mesh("cpu", (1,)), [Shard(0)])._spec
    source = "L['w']._spec"
    written = fact(source, "LAMBDA_GUARD", ["__dtensor_spec_140000"], value=lambda: spec, identity=identity)
    assert written == Fact(source, "LAMBDA_GUARD", identity_of_spec(spec))
    with pytest.raises(Unprovable, match="not what the check compares"):
        fact(source, "LAMBDA_GUARD", ["__dtensor_spec_140000"], value=lambda: object(), identity=identity)


def identity_of_spec(spec):
    from stableguards.identity.distributed import dtensor_spec

    return dtensor_spec(spec)


def test_a_forward_run_through_super_on_the_frames_module_runs_none_of_its_hooks():
    """A block's hooks (FSDP2's) run around its forward frame, in the caller's ``__call__``.
    Under activation checkpointing the frame runs the parent class's forward on itself
    (``super().forward``): no hook runs there, and the frame's module keeps no hook check.
    Its own forward run again, or the module called, keeps the check."""
    import types

    from stableguards.warm_start.hooks.proofs import _hooks_run_outside
    from stableguards.warm_start.traced import Traced

    class Parent(torch.nn.Module):
        def forward(self, x):
            return x

    class Child(Parent):
        def forward(self, x):
            return super().forward(x)

    module = Child()

    def self_at(name):
        return {"self": types.SimpleNamespace(source=types.SimpleNamespace(name=name))}

    def outside(*inlined):
        traced = Traced()
        for code, name in inlined:
            traced.inline(code, {}, self_at(name))
        return _hooks_run_outside("L['self']", lambda source: module, Child.forward.__code__, traced)

    assert outside() and outside((Parent.forward.__code__, "L['self']"))
    assert not outside((Child.forward.__code__, "L['self']"))  # its own forward again
    assert not outside((torch.nn.Module._call_impl.__code__, "L['self']"))  # the module called
    assert outside((Parent.forward.__code__, "L['self'].sub"))  # a submodule's: its own facts


def test_a_module_kept_in_a_cell_is_told_by_the_module_the_cell_holds():
    """``_call_impl`` keeps ``self`` in a cell (its nested functions read it): the module called
    is the cell's, with its source; a cell that cannot be read stays a module without one."""
    import types

    from stableguards.warm_start.hooks.tracing import _through_cells

    class CellVariable:  # Dynamo's tracker of a cell, by name
        pass

    cell, module = CellVariable(), types.SimpleNamespace(source=types.SimpleNamespace(name="L['self'].q"))
    cells = {id(cell): module}
    parent = types.SimpleNamespace(output=types.SimpleNamespace(side_effects=types.SimpleNamespace(
        load_cell=lambda c: cells[id(c)])))
    assert _through_cells({"symbolic_locals": {"self": cell, "x": 1}, "parent": parent}) == {"self": module, "x": 1}
    empty = CellVariable()
    assert _through_cells({"symbolic_locals": {"self": empty}, "parent": parent})["self"] is empty
    plain = {"self": module}
    assert _through_cells({"symbolic_locals": plain, "parent": parent}) is plain
