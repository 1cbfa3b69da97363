"""Graphs torch's AOTAutograd cache bypasses, keyed by what they run where that has an identity.

torch bypasses its AOTAutograd cache for a graph whose behaviour its key may
not hold: a custom ``autograd.Function`` (unless
``autograd_cache_allow_custom_autograd_functions``), a call to a function it
does not know (an ``fx.wrap``'d function in saved-tensor hook graphs without
``user_cache_hash``), a method call on a value with no example (``x.to(...)``
in a hook graph), a selective-checkpointing ``context_fn`` without
``cache_hash``.  Every restart then compiles such a graph again.

``reads`` describes a function by what it runs and everything it reads that
the key does not hold (plain logic); ``hooks`` adds those descriptions to
torch's key, so the graph is cached, and names each bypass that remains;
``messages`` words both.
"""
