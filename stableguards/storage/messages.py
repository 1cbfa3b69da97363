"""What the store tells the event log when it cannot be read or written, whichever part asked."""

from __future__ import annotations

from stableguards.events import EVENTS


# One warning per process for the store, whatever failed first (a wrong key or an unreachable
# Redis fails every read alike); explain() names each entry.
def warn_unreadable(what: str, store: str, error: Exception) -> None:
    EVENTS.warn_once("store read", f"stableguards: {what} could not be read from {store} ({error!s:.200}); "
                                   f"compiling as usual")


def warn_unwritable(what: str, store: str, error: Exception) -> None:
    EVENTS.warn_once("store write", f"stableguards: {what} could not be saved to {store} ({error!s:.200}); "
                                    f"it is compiled again after a restart")
