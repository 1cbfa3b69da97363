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

