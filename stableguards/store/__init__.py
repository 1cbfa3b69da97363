"""One store for everything a restart needs, shared by every rank and replica that names it.

``STABLEGUARDS_STORE`` is a directory (the default: ``<inductor cache dir>/stableguards/store``)
or a Redis URL (``redis://host:port/db``); ``STABLEGUARDS_STORE_KEY`` signs every entry and
refuses entries that are not signed with it.  ``content`` is the protocol (entries by digest,
verified, signed), ``engines`` where the bytes live.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from stableguards.store.content import ContentStore, Unusable
from stableguards.store.engines import DirectoryEngine, Engine, RedisEngine, Unavailable

STORE_ENV = "STABLEGUARDS_STORE"
KEY_ENV = "STABLEGUARDS_STORE_KEY"

__all__ = ["STORE_ENV", "KEY_ENV", "ContentStore", "Unusable", "Unavailable", "is_redis", "open_store"]


def is_redis(location: str) -> bool:
    return location.startswith(("redis://", "rediss://", "unix://"))


def open_store(default_dir: Path, location: str | None = None, key: str | None = None) -> ContentStore:
    """The store the environment names (``location`` and ``key`` stand in for it), or the
    directory ``default_dir``.  Raises ImportError for Redis without its client."""
    location = os.environ.get(STORE_ENV) if location is None else location
    key = os.environ.get(KEY_ENV) if key is None else key
    engine: Engine = _redis(location) if location and is_redis(location) else DirectoryEngine(location or default_dir)
    return ContentStore(engine, key.encode() if key else None)


@functools.lru_cache(maxsize=8)  # one client (and its connection pool) per URL per process
def _redis(url: str) -> RedisEngine:
    return RedisEngine(url)
