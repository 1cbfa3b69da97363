"""What warm start keeps for this process: a record per package (``Ours``), the entries they
loaded, and per thread the compile (``Compiling``) and the load (``Loading``) under way."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from stableguards.components import Components
from stableguards.warm_start.traced import Traced
from stableguards.warm_start.variants import Call


@dataclasses.dataclass
class Ours:
    """A package stableguards made: what its key needs besides the function; once
    torch.compile(fn) ran, the key and the function's code."""

    backend: str
    dynamic: Any
    key: Components | None = None
    code: Any = None
    # Calls its compiles folded about this process (a rank): its entry is kept per answer.
    folded: set[Call] = dataclasses.field(default_factory=set)
    # Its entry, waiting for a graph compiled later (a backward, on first use): hooks.compiles._save.
    pending: Pending | None = None


@dataclasses.dataclass(eq=False)
class Pending:
    """A package's entry waiting for a graph compiled later (a backward, on first use)."""

    frame: str
    ours: Ours
    entry: Any  # the package's entry when it last compiled: its codes are the package's own
    orphan: Any = None  # weakref.finalize: keeps this record once the package is gone



@dataclasses.dataclass(frozen=True)
class Compiling:
    """A graph compiled for one of our packages on this thread (``STATE.compiling``): a frame
    (``hooks.compiles.compile_frame``), or the backward of one of our graphs compiled on first
    use (``hooks.bundling``).  A compile nested in another is a copy with its own fields
    changed (``WarmStart.compiling_as``); the empty one stands for none."""

    frame: str | None = None  # the frame compiled for one of our packages (for explanations)
    traced: Traced | None = None  # what tracing that frame read beyond its guards
    backward_of: str | None = None  # the backend id whose backward is compiled on first use
    # Whether an AOTAutograd entry made here is bundled (self-contained), as a package saves
    # its graphs from them.
    bundling: bool = False
    proof: Any = None  # the proof of the entry whose guards are being saved (hooks.guards)


@dataclasses.dataclass(frozen=True)
class Loading:
    """A saved entry being loaded on this thread (``STATE.loading``), as ``Compiling``."""

    package: Any = None  # the package whose entries are being installed (hooks._install)
    checking: bool = False  # saved guards being loaded back to be checked (hooks.guards._round_trip)
    # Source -> the checks bound on first call made while a saved entry's guards are built.
    bindings: dict[str, Binding] | None = None
    compiled: bool = False  # inductor loading a graph for one of our entries (kernels._load_compiled_graph)
    kernel_binary: str | None = None  # the binary of the C++ kernel it is loading (kernels._kernel_source)


class WarmStart:
    """Our packages, the entries they loaded, what is being compiled and loaded (``warm_start.hooks``)."""

    def __init__(self) -> None:
        # Packages stableguards made (hooks._optimize) -> their Ours record.  Only
        # these are keyed, loaded, saved or touched by any warm-start hook.
        self.ours: weakref.WeakKeyDictionary[Any, Ours] = weakref.WeakKeyDictionary()
        # The backend ids (__compiled_fn_N_<uuid>) of graphs compiled for our packages.
        self.backend_ids: set[str] = set()
        # Backend ids of our graphs inductor compiled with flattened inputs (compiled autograd's
        # graphs: hooks.bundling._flattened).
        self.flattened: set[str] = set()
        # Backend ids whose graphs cannot be saved -> why (hooks.signals.leave_out).
        self.unsaveable: dict[str, str] = {}
        # by_code(code) -> (key digest, weak package) of the entries installed on it.
        self.installed: dict[tuple[int, Any], tuple[str, weakref.ref]] = {}
        # by_code(code) -> the keys of every compiled context made for it ("other": no key).
        self.contexts: dict[tuple[int, Any], set[str]] = {}
        # Keys of the entries this process saved (never loaded back by it).
        self.saved_here: set[str] = set()
        # The waiting entries (Ours.pending) of packages that are gone.
        self.orphans: list[Pending] = []
        # by_code(code) -> loaded entries not yet in Dynamo's cache, in the order tried
        # (hooks.LoadedEntry).
        self.loaded: dict[tuple[int, Any], list[Any]] = {}
        # Loaded id checks bound on their entry's first call (hooks.rebuilt_checks.ID_ON_FIRST_CALL),
        # by token, while their guard trees live.
        self.bindings: weakref.WeakValueDictionary[int, Binding] = weakref.WeakValueDictionary()
        # The graph compiled for one of our packages on this thread, and the saved entry loaded.
        self.compiling: contextvars.ContextVar[Compiling] = contextvars.ContextVar("stableguards_warm_compiling",
                                                                                  default=Compiling())
        self.loading: contextvars.ContextVar[Loading] = contextvars.ContextVar("stableguards_warm_loading",
                                                                              default=Loading())

    def compiling_as(self, **changes: Any) -> contextlib.AbstractContextManager[Compiling]:
        """A compile nested in this thread's: the current one with ``changes``, while in the block."""
        return _nested(self.compiling, changes)

    def loading_as(self, **changes: Any) -> contextlib.AbstractContextManager[Loading]:
        """A load nested in this thread's: the current one with ``changes``, while in the block."""
        return _nested(self.loading, changes)

    def drop_loaded(self, package: Any = None) -> None:
        """Forget the loaded entries of ``package`` (of every package if None)."""
        for row, entries in list(self.loaded.items()):
            kept = [e for e in entries if package is not None and e.package() not in (package, None)]
            if kept:
                self.loaded[row] = kept
            else:
                del self.loaded[row]

    @staticmethod
    def by_code(code: Any) -> tuple[int, Any]:
        """A table key for a code object by identity.  Code objects compare equal by
        content, file aside: ``fn`` in two modules, at the same line with the same
        body, would share one row.  The key holds the code, so its id stays its own."""
        return id(code), code

    def reset(self) -> None:
        """Forget what a restarted process would not know: what this one saved and installed,
        and which contexts it made (``registry.reset``: for tests, also ones that restart
        within one process).  Tables that follow live objects stay."""
        self.saved_here.clear()
        self.contexts.clear()
        self.installed.clear()


@contextlib.contextmanager
def _nested(var: contextvars.ContextVar[Any], changes: dict[str, Any]) -> Iterator[Any]:
    token = var.set(dataclasses.replace(var.get(), **changes))
    try:
        yield var.get()
    finally:
        var.reset(token)


class Binding:
    """The object a loaded id check checks: none until its entry's proof binds it, on the
    call the entry first serves (``hooks.proofs``).  Held weakly, as Dynamo's id checks
    on an optimizer are backed by a weak reference: an object that is gone fails it."""

    _tokens = itertools.count()

    def __init__(self) -> None:
        self.token = next(self._tokens)
        self._ref: Callable[[], Any] | None = None  # a weak reference, or a holder
        # The source it checks, where its check sits on an ancestor's guard manager (a dict's
        # takes no lambda guard: hooks.rebuilt_checks._add_bound_check); None: the check's own.
        self.at: str | None = None

    def bind(self, obj: Any) -> bool:
        """Bind to ``obj`` unless bound; whether it now checks ``obj``.  One with no weak
        reference (a dict whose id was a memo key) is held, as the entry holds its graph."""
        if self._ref is None:
            try:
                self._ref = weakref.ref(obj)
            except TypeError:
                self._ref = lambda: obj  # type: ignore[assignment]
        return self._ref() is obj

    @property
    def bound(self) -> bool:
        return self._ref is not None

    def unbind(self) -> None:
        """Bound by a proof that then refused its call: bound by none (``proofs.verify``)."""
        self._ref = None

    def passes(self, obj: Any) -> bool:
        return self._ref is None or self._ref() is obj

    def get(self) -> Any:
        """The object it checks (None: unbound, or gone)."""
        return None if self._ref is None else self._ref()


STATE = WarmStart()


class TypeBinding(Binding):
    """The class a loaded type check checks (``rebuilt_checks.TYPE_ON_FIRST_CALL``): the class of the
    object at its source on the call its entry first serves."""

    def bind(self, obj: Any) -> bool:
        return super().bind(type(obj))

    def passes(self, obj: Any) -> bool:
        return super().passes(type(obj))


class VersionBinding(Binding):
    """The version of the dict a loaded version check checks (PEP 509: unique to one dict in
    one state), bound on the call its entry first serves; ``version`` reads a dict's."""

    def __init__(self, version: Callable[[dict], int]) -> None:
        super().__init__()
        self._version = version
        self._bound: int | None = None

    def bind(self, obj: Any) -> bool:
        if self._bound is None:
            self._bound = self._version(obj)
        return self._bound == self._version(obj)

    @property
    def bound(self) -> bool:
        return self._bound is not None

    def unbind(self) -> None:
        self._bound = None

    def passes(self, obj: Any) -> bool:
        return self._bound is None or (type(obj) is dict and self._bound == self._version(obj))

    def get(self) -> Any:
        return None
