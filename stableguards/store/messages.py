"""What the shared store tells the event log about torch's artifacts it holds."""

from __future__ import annotations

from stableguards.events import EVENTS
from stableguards.storage import messages

_WHAT = {"fx_graph": "an inductor graph", "aot_autograd": "an AOTAutograd entry",
         "kernel_binary": "a compiled kernel binary"}


def read(namespace: str) -> None:
    """torch found one of its artifacts in the store (another process, maybe another machine, made it)."""
    EVENTS.count(f"store_{namespace}_read")


def written(namespace: str) -> None:
    EVENTS.count(f"store_{namespace}_written")


def unreadable(namespace: str, store: str, error: Exception) -> None:
    """A corrupt, truncated, foreign or unsigned artifact, or an unreachable store: compiled as on a miss."""
    EVENTS.count("store_unreadable")
    EVENTS.note(f"store: {_WHAT[namespace]} in {store} could not be read ({error!s:.200}); compiled as usual")
    messages.warn(f"{_WHAT[namespace]} could not be read", store, error)


def unwritable(namespace: str, store: str, error: Exception) -> None:
    messages.warn(f"{_WHAT[namespace]} could not be saved", store, error)


def built_elsewhere(store: str, differing: list[str]) -> None:
    """Kernels this process builds were built for the store by a machine that differs in
    ``differing`` (another compiler, torch or platform): built here, said once."""
    EVENTS.count("store_kernel_binary_unusable")
    what = ", ".join(differing) or "the build command"
    EVENTS.note(f"store: kernel binaries in {store} were built with another {what}; built here")
    EVENTS.warn_once(f"kernel binaries {store}", f"stableguards: the kernel binaries in {store} were built with "
                                                 f"another {what} than this machine's; this machine builds its own "
                                                 f"(and publishes them for machines like it)")
