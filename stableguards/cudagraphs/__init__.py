"""Cudagraph static inputs: say which one moved when a graph is re-recorded, or refuse.

``checks`` keeps the addresses and names (plain logic), ``state`` what this
process recorded, ``messages`` what it warns and explains, ``hooks`` where
torch's cudagraph trees are read.

``strict_static_inputs``: set it to True to raise ``StaticInputMoved`` instead
of warning when a static input moved (``stableguards.cudagraphs.strict_static_inputs = True``).
"""

strict_static_inputs = False
