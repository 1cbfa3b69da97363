"""BACKEND_MATCH: which compiled code may be served to which backend.

``fingerprint`` holds the rules (plain logic), ``messages`` what a switch or a
release tells the event log, ``hooks`` where Dynamo's cache entries are given
the interned key of their backend's fingerprint.
"""
