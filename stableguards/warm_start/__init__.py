"""Warm start: a restarted process installs each frame as compiled, without tracing it again.

Its policy is plain logic:

* ``key``: the entry's identity, an ordered list of named components;
* ``identity``: what an object is, told the same way in every process;
* ``guard_rules``: the table from a live guard's kind to the saved check that
  proves as much in another process, and the comparison of two guard trees;
* ``facts``: what Dynamo leaves unguarded inside one process but a restart
  must check (module hooks, builtins a global shadows, constant functions);
* ``proof``: the facts saved with an entry, and the check a restart makes;
* ``index``: the last key saved per function, so a miss can name what changed.

``hooks`` connects them to torch's package machinery and reads torch's guard
trees (``hooks.proofs``); ``state`` and ``messages`` are its process state and
what it tells the event log.
"""
