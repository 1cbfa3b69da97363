"""Warm start's entries in the store: fetch (waiting on another process's lease), publish,
release, and explain a miss.

A thin layer over the one configured store (``storage.configured``: ``STABLEGUARDS_STORE``,
or a directory of ours in the cache dir), in the shape of JAX's ``compilation_cache``: the
hook layer asks for bytes under a key and hands bytes back; what an entry is, it knows.

* Entries live in ``warm_start/<key digest>``, or, where a compile folded calls about its
  process (a rank), in ``warm_start/<digest>.<variant>`` with the calls in
  ``warm_start_calls/<digest>`` (``warm_start.variants``).
* While one process compiles an entry it holds the entry's lease; another process that
  finds the lease held waits for the entry instead of compiling the same graphs.  A
  compile that ends with nothing to save says so in ``warm_start_left_out/<digest>``
  as it gives the lease back: processes that need the entry then compile at once,
  neither waiting nor taking a lease for an entry that is not coming (a process that
  saves it after all is found first).  A rank of a distributed job never waits
  (``in_a_job``): the holder may be another rank of the job, waiting on this one's
  collectives.
* The miss index: each saved key, by function, in ``warm_start_index/<function>``, so a
  process whose key finds nothing (a fresh replica included) can name the components that
  changed.  A local copy (``<cache dir>/stableguards/warm_start``) lists the functions for
  the audit (``python -m stableguards audit``).
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import types
from collections.abc import Callable

from stableguards.components import Components
from stableguards.hooks.core import cache_subdir
from stableguards.storage import ContentStore, configured
from stableguards.storage.leases import lease_seconds
from stableguards.warm_start import variants
from stableguards.warm_start.index import changed_components, differences, function_name, record, saved_key, write_index

NAMESPACE = "warm_start"
CALLS = "warm_start_calls"  # the calls an entry's variants are chosen by (warm_start.variants)
INDEX = "warm_start_index"
LEFT_OUT = "warm_start_left_out"  # entries a compile ended without: nobody waits for them


def store() -> ContentStore:
    """Our entries' store: ``STABLEGUARDS_STORE``, or a directory of ours in the cache dir."""
    return configured(cache_subdir("store"))


def fetch(store: ContentStore, digest: str) -> bytes | None:
    """The entry under ``digest``, or its variant for this process when its compiles folded
    calls about their process (``warm_start.variants``)."""
    calls = store.fetch(CALLS, digest)
    if calls is None:
        return store.fetch(NAMESPACE, digest)
    return store.fetch(NAMESPACE, f"{digest}.{variants.variant(calls)}")


class Leases:
    """The leases this process holds: key digest -> the store it holds it in, given back once
    the entry is saved or will not be (and at exit)."""

    def __init__(self) -> None:
        self.held: dict[str, ContentStore] = {}

    def fetch_or_claim(self, digest: str, waiting: Callable[[str], None], slow: Callable[[str], None],
                       not_coming: Callable[[str], None]) -> bytes | None:
        """The saved entry under ``digest``, or None.  While another process holds a live
        lease on it (it is compiling the same entry from the same store), wait for it instead of
        compiling the same graphs (``waiting`` and, past a few seconds, ``slow`` are told the
        holder); on a miss, take the lease, unless a compile of it ended with nothing to save
        (``not_coming`` is told why).  Raises what the store raises."""
        found = store()
        data = fetch(found, digest)
        if data is None and (why := _left_out(found, digest)) is not None:
            not_coming(why)
            return None
        replacing = None
        # Never wait for a lease this process holds itself (a compile of the same key under
        # way or unsaved here, e.g. before torch._dynamo.reset()), nor as a rank of a job.
        if data is None and digest not in self.held and not in_a_job():
            replacing = found.wait(NAMESPACE, digest, waiting, slow)
            data = fetch(found, digest)
            if data is None and (why := _left_out(found, digest)) is not None:
                not_coming(why)
                return None
        if data is None and found.claim(NAMESPACE, digest, replacing=replacing):
            if not self.held:
                atexit.register(self.release_all)  # an entry still waiting for its backward
            self.held[digest] = found
        return data

    def shorten(self, digest: str) -> None:
        """An entry that waits for its backward (compiled on first use, which may never come: a
        forward run with grad and no backward) keeps its lease for a tenth of the lease period,
        unrenewed: others wait that long for it at most, then compile it themselves."""
        held = self.held.get(digest)
        if held is None:
            return
        with contextlib.suppress(Exception):  # an unreachable store: the lease expires by itself
            held.release(NAMESPACE, digest)
            if held.claim(NAMESPACE, digest, lease_seconds() / 10, renewed=False):
                return
        self.held.pop(digest, None)

    def release(self, digest: str) -> None:
        held = self.held.pop(digest, None)
        if held is not None:
            with contextlib.suppress(Exception):  # an unreachable store: the lease expires by itself
                held.release(NAMESPACE, digest)

    def give_up(self, digest: str, why: str) -> None:
        """The compile of the entry under ``digest`` ended with nothing to save: said in the
        store (once) for every process that would wait for it, then the lease given back."""
        held = self.held.get(digest)
        if held is not None:
            with contextlib.suppress(Exception):  # only saves others a wait: never fails a compile
                if _left_out(held, digest) is None:
                    held.publish(LEFT_OUT, digest, why.encode())
        self.release(digest)

    def release_all(self) -> None:
        for digest in list(self.held):
            self.release(digest)


def _left_out(found: ContentStore, digest: str) -> str | None:
    """Why a compile of the entry under ``digest`` ended with nothing to save, if one did."""
    try:
        raw = found.fetch(LEFT_OUT, digest)
    except Exception:  # noqa: BLE001 - unusable: as if there were none (the entry may come)
        return None
    return None if raw is None else raw.decode("utf-8", "replace")[:300]


def publish(key: Components, code: types.CodeType, data: bytes, calls: bytes | None) -> None:
    """Save an entry under ``key`` (its variant for ``calls``, if its compiles folded any), and
    the key in the miss index.  Raises what the store raises."""
    found, name = store(), key.digest
    if calls is not None:
        name = f"{name}.{variants.variant(calls)}"
        found.publish(CALLS, key.digest, calls)
    found.publish(NAMESPACE, name, data)
    # The index only explains misses: a save never fails for it.
    with contextlib.suppress(Exception):
        write_index(cache_subdir("warm_start"), key, code)
    with contextlib.suppress(Exception):
        found.publish(INDEX, function_name(key, code), record(key))


def changed(key: Components, code: types.CodeType) -> list[str] | None:
    """How ``key`` differs from the last key saved for the same function (the store's index,
    else this machine's); None when nothing was saved for it or the keys are equal."""
    try:
        raw = store().fetch(INDEX, function_name(key, code))
        saved = saved_key(raw) if raw is not None else None
    except Exception:  # noqa: BLE001 - unreachable, unsigned or corrupt: this machine's index
        saved = None
    if saved is None:
        return changed_components(cache_subdir("warm_start"), key, code)
    return differences(key, saved)


LEASES = Leases()


def in_a_job() -> bool:
    """Whether this process is one rank of a distributed job of several (``torch.distributed``
    initialized, world size over 1).  Such a process never waits on a lease: its compiles run
    between collectives, and the holder may be another rank of the job blocked in one that
    waits for this rank (rank 0 holds an entry's lease until its backward compiles, and the
    backward's all-reduce needs rank 1, which would wait on that lease: a hang until the lease
    ran out).  Each rank compiles as it would with the flag off, and saves what it compiled."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:  # noqa: BLE001 - a group being torn down: not a job to wait in
        return False
