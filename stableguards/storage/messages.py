"""What the store tells the user when it cannot be read, written or trusted, whichever part asked.

One warning per cause and store in a process (an unreachable Redis fails every read and write
alike, a wrong key every entry): it names the store, the cause and what to do, and never
quotes what a file holds.  explain() names each entry.
"""

from __future__ import annotations

from stableguards.events import EVENTS

_WHAT_TO_DO = {
    "unreachable": "check that it is up and reachable from here; meanwhile this process compiles without it",
    "unwritable": "check its permissions and free space; what this process compiles is compiled again after a "
                  "restart",
    "unreadable": "check its permissions; this process compiles what it cannot read",
    "unsigned": "set the same STABLEGUARDS_STORE_KEY on every process that writes it; the entry is compiled "
                "here and saved signed",
    "signed with another key": "every process sharing the store needs the same STABLEGUARDS_STORE_KEY; the "
                               "entry is compiled here and saved with this one",
    "foreign": "another program or version wrote it; the entry is compiled here and saved over it",
    "missing": "its bytes were removed; the entry is compiled here and saved whole",
    "corrupt": "the entry is compiled here and saved whole",
    "not a store file": "something the store never writes is at that name (a link, a FIFO, a device, a folder, "
                        "or more bytes than it may hold): remove it; meanwhile it is ignored",
}


def warn(what: str, store: str, error: Exception) -> None:
    """``what`` (``"a compiled entry could not be read"``) in ``store``, for ``error``
    (``content.Unusable``, ``engines.Unavailable``: their ``cause``): said once per cause and store."""
    cause = getattr(error, "cause", "unreachable")
    to_do = _WHAT_TO_DO.get(cause, "it is ignored, and the entry compiled here")
    EVENTS.warn_once(f"store {store}: {cause}",
                     f"stableguards: the store {store}: {what} ({cause}: {error!s:.200}); {to_do}")


def warn_untrusted(store: str, why: str) -> None:
    """The store may hold what someone else wrote (``storage.trust``): said once per store and why."""
    EVENTS.warn_once(f"store {store}: trust {why[:40]}", f"stableguards: the store {store}: {why}")
