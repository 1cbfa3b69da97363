"""Stable symbol ids: a source's symbol id from a hash of its name, not from creation order.

``ids`` is the allocation (plain logic), ``state`` the per-compile bookkeeping,
``messages`` what a collision tells the event log, ``hooks`` where the ShapeEnv
asks for an id.
"""
