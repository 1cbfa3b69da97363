"""A module name for code that runs in torch.fx's own globals: a GraphModule's ``forward``.

torch.fx makes a graph module's ``forward`` by ``exec`` in a fresh dict of
globals (the graph's imports and the callables its nodes call: compiled
autograd's ops and backward prologues), with a file name from a per-process
counter (``<eval_with_key>.N``).  No module holds that dict, so a restarted
process has nowhere to install a saved entry for it.  Here it gets one, named
by what the code is and what every global it can read is::

    stableguards.fx_graphs.g<digest of the code and of each global's identity>

A restart that makes the same graph (compiled autograd capturing the same
backward) computes the same name and finds the entry; a graph whose code or
any global differs (another op, another prologue) gets another name, so
another key.  Naming every global, not only those Dynamo guards, is what makes
this sound: in one process Dynamo relies on a graph module's code being new
for every graph module (its cache is per code object), so its guards on such
a frame need not cover the globals; the name does.  A global with no identity
leaves the graph without a home: its compile is left out, as before.

Registering puts a holder in ``sys.modules`` whose ``__dict__`` is the graph's
globals, with ``__name__`` set to the name, which is what torch's package
reads (``sys.modules[python_module].__dict__``) to install compiled code and
build guards, and what ``identity.module_of_globals`` finds.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from stableguards.codes import code_digest
from stableguards.components import digest_text

PREFIX = "stableguards.fx_graphs."
# How the file name torch.fx gives the code it generates begins (a per-process counter follows).
FILE_PREFIX = "<eval_with_key>"
# What torch.fx puts in every graph's globals that is the scope's own, not a value code reads.
_SCOPE_OWN = frozenset({"__builtins__", "__name__"})


class _Home:
    """Stands in ``sys.modules`` for a graph's globals: its ``__dict__`` is that dict."""

    def __init__(self, scope: dict) -> None:
        object.__setattr__(self, "__dict__", scope)


def home_name(code: types.CodeType, scope: dict, describe: Callable[[Any], str | None]) -> tuple[str | None, str]:
    """The module name for ``code`` running in ``scope``, or None and the first global with no
    identity (``describe`` gives identities)."""
    parts = [code_digest(code)]
    for name in sorted(set(scope) - _SCOPE_OWN):
        described = describe(scope[name])
        if described is None:
            return None, name
        parts.append(f"{name}={described}")
    return PREFIX + "g" + digest_text("\n".join(parts))[:32], ""


def register(scope: dict, name: str, graph_class: type) -> str:
    """Make ``scope`` the globals of a module named ``name``, run by the methods of
    ``graph_class`` (the graph module's own class); returns ``name``."""
    held = sys.modules.get(name)
    if held is None or vars(held) is not scope:
        scope["__name__"] = name
        sys.modules[name] = _Home(scope)  # type: ignore[assignment]
        _CLASSES[name] = graph_class
    return name


def class_at(name: str) -> type:
    """The graph module class whose code runs in the home ``name`` in this process: what a
    saved guard on such a class is rebuilt against, as a class of an importable name is
    rebuilt against the class of that name (its identity is checked by the entry's proof)."""
    return _CLASSES[name]


def home_of_class(cls: type) -> str | None:
    """The home a graph module class was registered with, or None."""
    name = getattr(vars(cls).get("forward"), "__globals__", {}).get("__name__")
    return name if isinstance(name, str) and _CLASSES.get(name) is cls else None


# Registered graph module classes by home: one per graph a compile was asked for (as
# compiled autograd asks for each backward graph it captures), kept as torch's own
# caches keep the compiled graphs.
_CLASSES: dict[str, type] = {}
