"""What warm start tells the event log: what was saved, installed, left out, and why."""

from __future__ import annotations

from stableguards.events import EVENTS


def loaded(function: str) -> None:
    """A restarted process installed a saved entry for ``function``: no tracing for it."""
    EVENTS.count("warm_start_loaded")
    EVENTS.note(f"warm start: {function} installed its saved compiled entry")


def cold_state_made(function: str, made: list) -> None:
    """An optimizer was given the state the cold trace filled, and the saved entry served."""
    EVENTS.count("warm_start_optimizer_state_made")
    names = ", ".join(sorted({type(m.optimizer).__name__ for m in made}))
    params = sum(len(m.params) for m in made)
    EVENTS.note(f"warm start: {function}'s saved entry serves: {names} had no state for {params} parameter(s), "
                f"made as the cold trace made it (_init_group), instead of tracing the step again")


def not_used(function: str, reason: str) -> None:
    """A saved entry under the same key failed torch's checks, its proof or its install: traced again."""
    EVENTS.count("warm_start_not_used")
    EVENTS.note(f"warm start: {function}'s saved entry was not used ({reason}); compiled as usual")


def saved() -> None:
    EVENTS.count("warm_start_saved")


def not_coming(function: str, why: str) -> None:
    """A compile of the entry this process needs ended elsewhere with nothing to save: compiled
    here at once, without waiting for it or taking its lease."""
    EVENTS.count("warm_start_not_coming")
    EVENTS.note(f"warm start: {function}: the process that compiled its entry saved none ({why}); compiled "
                f"here without waiting for it")


def left_out(frame: str, reason: str) -> None:
    """A compile that cannot be saved soundly: a restart traces this frame again."""
    EVENTS.count("warm_start_left_out")
    EVENTS.note(f"warm start: {frame} is left out of its saved entry: {reason}")


def pending(frame: str) -> None:
    """An entry waits for a graph compiled on first use (a backward) before it is saved."""
    EVENTS.note(f"warm start: {frame}: entry saved once all its graphs are compiled (a backward compiles on "
                f"its first use)")


def missed(function: str, differences: list[str]) -> None:
    """A saved entry exists for ``function`` but under another key: which components differ."""
    EVENTS.count("warm_start_misses")
    shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
    EVENTS.note(f"warm start: {function} has a saved entry for another key; it differs in {shown}")


def waiting(function: str, store: str, holder: str) -> None:
    """Another process is compiling the entry this one needs, from the same store: waited for."""
    EVENTS.count("warm_start_waited")
    EVENTS.note(f"warm start: {function}: {holder} holds the lease on its entry in {store}; waited for it "
                f"instead of compiling the same graphs")


def waiting_long(function: str, store: str, holder: str) -> None:
    """A wait for another process's entry passed a few seconds: said once, naming who holds it."""
    EVENTS.warn_once(f"waiting {store}", f"stableguards: waiting for {holder} to compile {function} (it holds the "
                                         f"lease on its entry in {store}); a holder that stops renewing its lease "
                                         f"is given up on within STABLEGUARDS_STORE_LEASE_S")
