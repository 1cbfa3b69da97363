"""What distributed training puts in a compile's guards, told by value (``identity.objects``).

* A ``ContextVar`` that one of torch's config modules holds for an entry
  (``torch.compiler.config``'s ``compile_on_one_rank``: functional collectives
  read it): the config module's import name, the entry's name and attribute,
  and the value the config reads through it.  Sound: Dynamo's ``ID_MATCH`` on it proved
  "this is the variable the config entry holds"; a config module is imported
  under one name in every process and makes each entry's variable once, so the
  same path names the same variable there.  The config's value is said too,
  which proves more than the id did: set explicitly or left to its default, a
  value the trace read from it is the same.
* A class torch made at run time to wrap a module's class (``fully_shard``'s
  ``FSDP<Block>``, ``replicate``'s): the map torch keeps it in, the identities of
  its bases (torch's wrapper class, the wrapped class) and of its own namespace.
  Sound: torch makes it with ``type(prefix + name, (wrapper, wrapped), namespace)``,
  once per wrapped class, and keeps it in that map; so in another process the map
  holds, for a wrapped class of the same identity, a class made by the same code,
  and a class is nothing but its bases and its namespace.  (The id that named it is
  found there through the same map: ``warm_start.pickling``.)
* A ``ProcessGroup``: its backend, size, the global ranks in it, its name, its
  description and whether hooks are registered on it.  Sound: Dynamo's
  ``ID_MATCH`` on it proved "the group the compile saw"; what a graph uses of a
  group is what these say (collectives resolve it by name, ranks and size; a
  rank the trace read is a folded call, ``warm_start.variants``, kept per rank),
  and a restarted job makes its groups in the same order under the same names,
  so a group that agrees on all of them is the one the graph was traced for.
  Its rank is left out on purpose: ranks share an entry where nothing folded
  the rank.  A trace that calls ``group.rank()`` folds it (Dynamo evaluates that
  member on the real group, unguarded): it is recorded as the call
  ``group_rank(name)``, which the warm process makes again, and by which the
  entry is kept per rank (``warm_start.variants``), as ``dist.get_rank()`` is.
* A ``DeviceMesh`` as ``DeviceMesh.__eq__`` and torch's opaque-object guard on it
  compare it (rank map, layout, device type, dim names, thread, rank order), and
  the process group of each dim by value.  Sound: each is a value (ranks, sizes,
  names), so meshes with one description are equal by torch's check; the groups
  are more than torch checks, and needed across processes: a graph names a
  mesh dim's group by its name, and in another process that name must be a group
  of the same ranks.  The thread is written relative to the calling thread (None
  but under the threaded test backend).  What a trace reads of the mesh through
  a member torch evaluates on the real mesh without a guard (``get_rank``,
  ``get_coordinate``, ``get_local_rank``) is this rank's: such a read folds the
  rank (``warm_start.hooks.tracing``).
* A ``DTensorSpec`` as torch's DTENSOR_SPEC_MATCH compares it (``_check_equals``
  with shapes skipped): its mesh (as above), placements, shard order and dtype,
  each written by value.  Sound: that guard passes exactly for a spec equal to
  the one saved in these fields; two specs with one description are equal by it.

Plain Python: torch's modules are reached through ``sys.modules`` (a group exists only
when torch.distributed is imported).
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable
from typing import Any

from stableguards.codes import qualified
from stableguards.identity.names import short_digest

PROCESS_GROUP = "torch.distributed.distributed_c10d.ProcessGroup"
DTENSOR_SPEC = "torch.distributed.tensor._dtensor_spec.DTensorSpec"
DEVICE_MESH = "torch.distributed.device_mesh.DeviceMesh"
# Where torch keeps the classes it makes to wrap a module's class: (module, name of the map).
WRAPPER_MAPS = (("torch.distributed.fsdp._fully_shard._fully_shard", "cls_to_fsdp_cls"),
                ("torch.distributed._composable.replicate_with_fsdp", "cls_to_replicate_cls"))
# What Python keeps in every class's namespace: not what the class does.
_CLASS_BOOKKEEPING = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                                "__firstlineno__", "__static_attributes__"})
_CONFIG_MODULE = "torch.utils._config_module.ConfigModule"
_UNSET = object()  # what a variable without a value reads as: described as object()


def config_var(var: contextvars.ContextVar, describe: Callable[[Any], str | None]) -> str | None:
    """``var`` as the config entry that holds it and its value (described by ``describe``),
    or None where no config module of torch's holds it."""
    for name, module in list(sys.modules.items()):
        if not any(qualified(k) == _CONFIG_MODULE for k in type(module).__mro__):
            continue
        for key, entry in getattr(module, "_config", {}).items():
            for attribute, held in vars(entry).items() if hasattr(entry, "__dict__") else ():
                if held is var and sys.modules.get(name) is module:
                    # The value code reads: the config's, whether the variable holds it (set, or
                    # patched for a while) or the default does (unset).
                    value = describe(getattr(module, key) if attribute == "user_override" else var.get(_UNSET))
                    return None if value is None else f"contextvar:{name}.{key}.{attribute}={value}"
    return None


def wrapper_map(cls: type) -> tuple[str, str, type] | None:
    """Where torch keeps ``cls``, a class it made to wrap another: (module, map, the wrapped
    class); None for any other class."""
    bases = getattr(cls, "__bases__", ())
    if len(bases) != 2:
        return None
    for module, name in WRAPPER_MAPS:
        mapping = getattr(sys.modules.get(module), name, None)
        if isinstance(mapping, dict) and mapping.get(bases[1]) is cls:
            return module, name, bases[1]
    return None


def wrapper_class(cls: type, describe: Callable[[Any], str | None]) -> str | None:
    """``cls`` as the class torch made to wrap another (see the module docstring), or None."""
    found = wrapper_map(cls)
    if found is None:
        return None
    own = {k: v for k, v in vars(cls).items() if k not in _CLASS_BOOKKEEPING}
    parts = [describe(base) for base in cls.__bases__] + [describe(own)]
    if None in parts:
        return None
    return f"wrapper:{found[0]}.{found[1]}[{parts[1]}]#{short_digest(':'.join(parts))}"  # type: ignore[arg-type]


def group_rank(group_name: str) -> int:
    """This process's rank in the process group named ``group_name``: ``group.rank()`` as a
    call of plain values, which another process makes again."""
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    return c10d._resolve_process_group(group_name).rank()


def process_group(group: Any) -> str | None:
    """``group`` by value (see the module docstring), or None where it cannot be read."""
    dist = sys.modules.get("torch.distributed")
    try:
        ranks = dist.get_process_group_ranks(group) if dist is not None else None
        return (f"process_group:{group.name()}:size={group.size()}:ranks={ranks}:name={group.group_name}:"
                f"desc={group.group_desc}:hooks={group._has_hooks()}")
    except Exception:  # noqa: BLE001 - a group that cannot answer (destroyed, another torch) has no identity
        return None


def device_mesh(mesh: Any) -> str | None:
    """``mesh`` by what ``DeviceMesh.__eq__`` and its opaque guard compare (rank map, layout,
    device type, dim names, thread, rank order) and the process groups of its dims by value
    (see the module docstring), or None for anything that is not a ``DeviceMesh``."""
    if qualified(type(mesh)) != DEVICE_MESH:
        return None
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    try:
        groups = [process_group(c10d._resolve_process_group(name)) for name in getattr(mesh, "_dim_group_names", ())]
        current = mesh._thread_id is not None and mesh._thread_id == threading.get_ident()
        # Newer torch compares the rank order too; an older mesh has none (None).
        described = (f"device_mesh({mesh._device_type}:ranks={list(mesh._flatten_rank_map)}:layout={mesh._layout!r}:"
                     f"names={mesh._mesh_dim_names}:thread={'current' if current else mesh._thread_id}:"
                     f"rank_order={getattr(mesh, '_preserve_rank_order', None)}:groups={groups})")
    except Exception:  # noqa: BLE001 - a torch whose mesh keeps these otherwise, a group gone: no identity
        return None
    return None if None in groups else described


def dtensor_spec(spec: Any) -> str | None:
    """``spec`` as DTENSOR_SPEC_MATCH compares it (see the module docstring), or None for
    anything that is not a ``DTensorSpec``."""
    if qualified(type(spec)) != DTENSOR_SPEC:
        return None
    mesh = device_mesh(spec.mesh)
    if mesh is None:
        return None
    placements = ", ".join(f"{qualified(type(p))}:{p!r}" for p in spec.placements)
    dtype = None if spec.tensor_meta is None else spec.tensor_meta.dtype
    return f"dtensor_spec:{mesh}:placements=({placements}):shard_order={spec.shard_order!r}:dtype={dtype}"


def opaque_guarded(obj: Any) -> str | None:
    """What torch's opaque-object guard compares of ``obj`` (its type's ``guard_fn``), written by
    a description at least as fine: a device mesh's or a process group's; None for another type."""
    if qualified(type(obj)) == DEVICE_MESH:
        return device_mesh(obj)
    if qualified(type(obj)) == PROCESS_GROUP:
        return process_group(obj)
    return None
