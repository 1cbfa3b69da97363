"""Leases on warm-start entries (``warm_start.entries.Leases``), without Dynamo: a process
waits for an entry another one is compiling, and never for one a compile ended without."""

from __future__ import annotations

import threading
import time

from stableguards.warm_start.entries import NAMESPACE, Leases, store


def test_nobody_waits_for_an_entry_a_compile_ended_without(tmp_path, monkeypatch):
    monkeypatch.setenv("STABLEGUARDS_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("STABLEGUARDS_STORE_LEASE_S", "60")
    holder, waiter, later = Leases(), Leases(), Leases()  # three processes' leases (one owner here)
    assert holder.fetch_or_claim("d", _never, _never, _never) is None and store().held(NAMESPACE, "d")
    events: list[str] = []
    thread = threading.Thread(target=lambda: events.append(
        repr(waiter.fetch_or_claim("d", lambda by: events.append("waited"), _never, lambda why: events.append(why)))))
    thread.start()
    time.sleep(0.5)  # the waiter finds the lease held and waits for it
    holder.give_up("d", "f was left out")
    thread.join(timeout=30)
    assert events == ["waited", "f was left out", "None"]  # told why as soon as the lease went
    assert not store().held(NAMESPACE, "d")  # and it took no lease
    told: list[str] = []
    start = time.monotonic()
    assert later.fetch_or_claim("d", _never, _never, told.append) is None  # a restart: no wait, no lease
    assert told == ["f was left out"] and time.monotonic() - start < 5 and not store().held(NAMESPACE, "d")
    store().publish(NAMESPACE, "d", b"entry")  # saved after all (another input, another process)
    assert Leases().fetch_or_claim("d", _never, _never, _never) == b"entry"


def _never(*args: object) -> None:
    raise AssertionError("not expected")
