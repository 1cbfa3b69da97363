"""What distributed training puts in a compile's guards, told by value (``identity.objects``).

* A ``ContextVar`` that one of torch's config modules holds for an entry
  (``torch.compiler.config``'s ``compile_on_one_rank``: functional collectives
  read it): the config module's import name, the entry's name and attribute,
  and the value the variable holds.  Sound: Dynamo's ``ID_MATCH`` on it proved
  "this is the variable the config entry holds"; a config module is imported
  under one name in every process and makes each entry's variable once, so the
  same path names the same variable there.  The value is said too, which proves
  more than the id did (what the compile read from it is guarded apart).
* A ``ProcessGroup``: its backend, size, the global ranks in it, its name, its
  description and whether hooks are registered on it.  Sound: Dynamo's
  ``ID_MATCH`` on it proved "the group the compile saw"; what a graph uses of a
  group is what these say (collectives resolve it by name, ranks and size; a
  rank the trace read is a folded call, ``warm_start.variants``, kept per rank),
  and a restarted job makes its groups in the same order under the same names,
  so a group that agrees on all of them is the one the graph was traced for.
  Its rank is left out on purpose: ranks share an entry where nothing folded
  the rank.

Plain Python: torch's modules are reached through ``sys.modules`` (a group exists only
when torch.distributed is imported).
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable
from typing import Any

from stableguards.codes import qualified

PROCESS_GROUP = "torch.distributed.distributed_c10d.ProcessGroup"
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
                    value = describe(var.get(_UNSET))
                    return None if value is None else f"contextvar:{name}.{key}.{attribute}={value}"
    return None


def process_group(group: Any) -> str | None:
    """``group`` by value (see the module docstring), or None where it cannot be read."""
    dist = sys.modules.get("torch.distributed")
    try:
        ranks = dist.get_process_group_ranks(group) if dist is not None else None
        return (f"process_group:{group.name()}:size={group.size()}:ranks={ranks}:name={group.group_name}:"
                f"desc={group.group_desc}:hooks={group._has_hooks()}")
    except Exception:  # noqa: BLE001 - a group that cannot answer (destroyed, another torch) has no identity
        return None
