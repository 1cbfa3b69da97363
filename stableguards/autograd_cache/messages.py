"""What the AOTAutograd-cache feature tells the event log."""

from __future__ import annotations

from stableguards.events import EVENTS

_TORCHS_OWN = ("the function is torch's own (compiled autograd's graphs call such functions: one made for "
               "each backward graph it inlines), which torch refuses to cache and stableguards has no "
               "identity for: nothing in your code changes it")
# torch's bypass reason (a prefix of it) -> what the user can do about it.
_FIXES = (
    ("SAC context_fn", "its context_fn (or a function it reads) has no identity across processes (a closure "
                       "over an object without one, code made by exec): give the context_fn a `cache_hash` "
                       "attribute that changes whenever its policy does"),
    ("Unsupported call_function target torch.", _TORCHS_OWN),
    ("Unsupported call_function target <function AutogradCompilerInstance.", _TORCHS_OWN),
    ("Unsupported call_function target <function TensorVariable._method_register_hook.",
     "torch calls a tensor hook registered inside the compiled function through a trampoline of its own, "
     "which its cache refuses: a hook on a tensor the function receives can be registered before the call"),
    ("Unsupported call_function", "the function called (or a global it reads) has no identity across "
                                  "processes (a closure over an object without one, code made by exec): make "
                                  "it a module-level function, or mark it with `torch.fx.wrap` and set a "
                                  "`user_cache_hash` that changes whenever its code does"),
    ("Unsupported call_method", "a method called on a value that is not known to be a tensor, in a graph "
                                "that also calls something with no identity across processes"),
)


def identified(frame: str, labels: list[str]) -> None:
    """A graph torch would have bypassed is keyed by the identity of what it runs."""
    EVENTS.count("autograd_cache_identified")
    EVENTS.note(f"{frame}: AOTAutograd cache key holds the identity of {', '.join(labels)} (torch would bypass "
                f"its cache for this graph)")


def bypassed(frame: str, reason: str) -> None:
    """torch's AOTAutograd cache still bypasses this graph: every restart compiles it again."""
    EVENTS.count("autograd_cache_bypasses")
    fix = next((fix for prefix, fix in _FIXES if reason.startswith(prefix)), None)
    first = reason.strip().splitlines()[0] if reason.strip() else "no reason given"
    EVENTS.note(f"{frame}: AOTAutograd cache bypassed ({first}); every restart compiles this graph again"
                + (f"; to cache it: {fix}" if fix else ""))
