"""Warm start's plain logic: which saved entry a restarted process may use, and why.

* ``key``: the entry's identity, an ordered list of named components;
* ``identity``: what an object is, told the same way in every process;
* ``guard_rules``: the table from a live guard's kind to the saved check that
  proves as much in another process, and the comparison of two guard trees;
* ``facts``: what Dynamo leaves unguarded inside one process but a restart
  must check (module hooks, builtins a global shadows, constant functions).

``stableguards.hooks.precompile`` connects them to torch.
"""

from stableguards.warm_start.key import (
    EntryKey,
    code_at,
    code_digest,
    code_path,
    config_digest,
    entry_key,
    stable_repr,
)

__all__ = ["EntryKey", "code_at", "code_digest", "code_path", "config_digest", "entry_key", "stable_repr"]
