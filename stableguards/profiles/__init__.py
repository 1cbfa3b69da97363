"""Specialization-aware automatic-dynamic profiles, kept without a job id.

``profile`` is the data model and its merge, ``store`` where profiles live
(local files, Redis, torch's remote cache), ``session`` one process's dealings
with its profile, ``identity`` the names that are the same in every process;
``state``, ``messages`` and ``hooks`` connect them to Dynamo.
"""
