"""Specialization-aware PGO profiles: safe JSON, a local directory or Redis.

``profile`` is the data model and its merge, ``store`` where profiles live,
``session`` one process's reads and writes, ``identity`` the stable code and
profile identities.  None of it imports torch; ``stableguards.hooks.profiles``
connects it to Dynamo.
"""
