"""The event log: every counter, explanation and warning stableguards gives goes through it.

A feature records what happened in words a user can act on (``note``) and
counts it (``count``); ``explain()`` reads them back, newest last, and
``TORCH_LOGS=stableguards`` prints each as it happens (a listener).  Each
feature's own wording lives in its ``messages`` module.  Plain Python: no torch.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

log = logging.getLogger("stableguards")

# Explanations are kept for the most recent events only: a long-running job must
# not grow memory because it compiles often.  Likewise the warnings remembered.
_MAX_EVENTS = 256
_MAX_WARNED = 1024


class EventLog:
    """Counters, recent explanations and warnings already given, for this process."""

    def __init__(self) -> None:
        self.counters: collections.Counter[str] = collections.Counter()
        self._events: collections.deque[str] = collections.deque(maxlen=_MAX_EVENTS)
        self._warned: collections.OrderedDict[str, None] = collections.OrderedDict()
        # Called with each explanation as it is recorded (the TORCH_LOGS artifact).
        self.listeners: list[Callable[[str], None]] = []
        # Wall seconds spent in each named part of our work, exclusive of the parts timed
        # inside it, so they add up (what bench/first_step.py splits a first step into).
        self.seconds: collections.Counter[str] = collections.Counter()
        self._timing = threading.local()

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``seconds[name]``, less what blocks timed inside
        it (on this thread) took: each second is counted once, by the innermost name."""
        stack = self._timing.__dict__.setdefault("stack", [])
        stack.append(0.0)  # seconds of the blocks timed inside this one
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[name] += elapsed - stack.pop()
            if stack:
                stack[-1] += elapsed

    def note(self, text: str) -> None:
        """An explanation: why a restart missed, recompiled, bypassed or left something out."""
        self._events.append(text)
        for listener in self.listeners:
            listener(text)

    def warn_once(self, key: str, message: str) -> None:
        """A warning, given once per ``key`` in this process."""
        if key in self._warned:
            return
        self._warned[key] = None
        while len(self._warned) > _MAX_WARNED:
            self._warned.popitem(last=False)
        log.warning(message)

    def warned(self, key: str) -> bool:
        return key in self._warned

    def fell_back(self, hook: str, error: BaseException) -> None:
        """A hook of ours failed and torch's own behaviour was used: counted, explained, warned once."""
        self.count("fallbacks")
        self.note(f"hook {hook!r} failed ({type(error).__name__}: {error}); torch's own behaviour was used")
        self.warn_once(hook, f"stableguards hook {hook!r} failed ({error!r}); using torch's own behaviour")

    def explain(self, disabled: Iterable[str] = ()) -> str:
        """Counters so far and, newest last, the events that make a restart miss or differ."""
        counts = ", ".join(f"{name}={value}" for name, value in sorted(self.counters.items()))
        lines = ["stableguards: " + (counts or "nothing recorded yet")]
        if disabled:
            lines.append("  parts left to torch (STABLEGUARDS_DISABLE): " + ", ".join(sorted(disabled)))
        lines += ["  " + text for text in self._events]
        return "\n".join(lines)

    def reset(self) -> None:
        """Forget counters, explanations and warnings given (for tests)."""
        self.counters.clear()
        self.seconds.clear()
        self._events.clear()
        self._warned.clear()


EVENTS = EventLog()
