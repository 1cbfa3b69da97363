"""One store for everything a restart needs, shared by every rank and replica that names it.

``STABLEGUARDS_STORE`` is a directory (the default: ``<inductor cache dir>/stableguards/store``)
or a Redis URL (``redis://host:port/db``); ``STABLEGUARDS_STORE_KEY`` signs every entry and
refuses entries that are not signed with it.  ``content`` is the protocol (entries by digest,
verified, signed), ``engines`` where the bytes live, ``artifacts`` the names torch's
artifacts have in it.  Every part reads and writes through ``configured``: one store per
environment, built once.

Shared by every part (no part owns it): the ``store`` part is what serves torch's own
remote caches from it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from stableguards.storage import trust
from stableguards.storage.content import ContentStore, Unusable
from stableguards.storage.engines import DirectoryEngine, Engine, RedisEngine, Unavailable

STORE_ENV = "STABLEGUARDS_STORE"
KEY_ENV = "STABLEGUARDS_STORE_KEY"

__all__ = ["STORE_ENV", "KEY_ENV", "ContentStore", "Unusable", "Unavailable", "configured", "is_redis", "open_store",
           "redis_engine"]


def is_redis(location: str) -> bool:
    return location.startswith(("redis://", "rediss://", "unix://"))


def open_store(default_dir: Path | None, location: str | None = None, key: str | None = None) -> ContentStore:
    """The store the environment names (``location`` and ``key`` stand in for it), or the
    directory ``default_dir``.  Raises ImportError for Redis without its client."""
    location = os.environ.get(STORE_ENV) if location is None else location
    key = os.environ.get(KEY_ENV) if key is None else key
    engine: Engine = (redis_engine(location) if location and is_redis(location)
                      else DirectoryEngine(location or default_dir))
    return ContentStore(engine, key.encode() if key else None)


@functools.lru_cache(maxsize=8)  # one client (and its connection pool) per URL per process
def redis_engine(url: str) -> RedisEngine:
    return RedisEngine(url)


def configured(default_dir: Path | None) -> ContentStore:
    """The store every part uses: ``STABLEGUARDS_STORE`` signed with ``STABLEGUARDS_STORE_KEY``,
    or the directory ``default_dir``; one per environment and directory, built once (like
    JAX's lazily built cache object).  Raises ImportError for Redis without its client."""
    return _configured(os.environ.get(STORE_ENV) or "", os.environ.get(KEY_ENV) or "",
                       None if default_dir is None else str(default_dir))


@functools.lru_cache(maxsize=16)
def _configured(location: str, key: str, default_dir: str | None) -> ContentStore:
    store = open_store(Path(default_dir) if default_dir is not None else None, location, key)
    if location or default_dir is not None:  # said once: this store is built once
        trust.check(store.describe(), None if is_redis(location) else Path(location or str(default_dir)),
                    bool(location), bool(key))
    return store
