"""The one list of stableguards' features, and everything derived from it.

Each feature is a package, ``stableguards.<name>``: its plain logic, its
``hooks`` module (the table of torch seams it hooks, ``HOOKS``), its ``state``
(what it keeps for this process, ``STATE``, if anything) and its ``messages``
(what it tells the event log).  From ``FEATURES`` come the parts a user can
leave to torch (``STABLEGUARDS_DISABLE``), the installer's hook tables
(``stableguards.hooks.hook_tables``), ``reset()`` and the hook table in
``docs/hooks.md`` (``python -m stableguards hooks``).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

DISABLE_ENV_VAR = "STABLEGUARDS_DISABLE"


@dataclass(frozen=True)
class Feature:
    name: str  # the part: its package, and its name in STABLEGUARDS_DISABLE
    summary: str  # what it does, in one line
    doc: str  # where its rationale is
    # Earlier part names that still leave it to torch (STABLEGUARDS_DISABLE=pgo).
    was: tuple[str, ...] = ()
    # Built on machinery only the newest tested torch has: off, with an info log, on older ones.
    newest_torch_only: bool = False

    @property
    def package(self) -> str:
        return f"stableguards.{self.name}"


FEATURES = (
    Feature("symbols", "symbol ids (s68) from a hash of the source's name, so a restart names them as the "
                       "cold run did and the cache keys match", "docs/profiles.md"),
    Feature("profiles", "automatic-dynamic profiles without a job id, that never hand a specialized dimension "
                        "to the next process as dynamic", "docs/profiles.md", was=("pgo",)),
    Feature("backends", "code compiled for one backend is served to another only if the two are provably "
                        "equivalent, and dies with its backend", "docs/backend_match.md", was=("backend",)),
    Feature("keys", "a ledger of FX-graph cache keys: a miss names the component that differs from the "
                    "closest earlier key; a recompile names its guards", "docs/profiles.md"),
    Feature("autograd_cache", "graphs torch's AOTAutograd cache bypasses (custom autograd.Function, calls to "
                              "user functions, saved-tensor hook graphs, checkpointing policies) are keyed by "
                              "what they run and read, and inlined hooks are guarded by it; a bypass that remains "
                              "is named", "docs/autograd_cache.md"),
    Feature("optimizers", "fewer, cheaper optimizer guards; entries that die with their optimizer; "
                          "`stableguards.static_grads(opt)` for cudagraphs", "docs/optimizers.md", was=("optimizer",)),
    Feature("hyperparams", "scheduled lr, betas and momentum stay graph inputs: no recompiles",
            "docs/optimizers.md", was=("optimizer",)),
    Feature("cudagraphs", "a static input that moved is named when cudagraphs re-record", "docs/cudagraphs.md"),
    Feature("warm_start", "(torch 2.15) each inductor frame saved as compiled; a restart installs it without "
                          "tracing, once its guards prove there what they proved in the cold process",
            "docs/warm_start.md",
            was=("precompile",), newest_torch_only=True),
    Feature("store", "with STABLEGUARDS_STORE named, inductor's graphs, AOTAutograd's entries and the kernel "
                     "binaries built from them are kept there too (verified and signed), so any process sharing it "
                     "finds them and a new machine builds no kernel a machine like it built",
            "docs/store.md"),
)
PARTS = tuple(feature.name for feature in FEATURES)


def parts_table() -> str:
    """The parts as a markdown table (``python -m stableguards parts``; the README holds it)."""
    rows = ["| part | what it does | details |", "|---|---|---|"]
    rows += [f"| `{f.name}` | {f.summary[0].upper()}{f.summary[1:]} | [{f.doc.rsplit('/', 1)[-1][:-3]}]({f.doc}) |"
             for f in FEATURES]
    return "\n".join(rows)


def feature(name: str) -> Feature:
    return next(f for f in FEATURES if f.name == name)


def disabled_parts(setting: str | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """The parts ``STABLEGUARDS_DISABLE`` leaves to torch (earlier names included), and the names
    in it that are no part's."""
    setting = os.environ.get(DISABLE_ENV_VAR, "") if setting is None else setting
    names = {name.strip() for name in setting.split(",") if name.strip()}
    parts = {f.name for f in FEATURES if f.name in names or names & set(f.was)}
    unknown = names - set(PARTS) - {old for f in FEATURES for old in f.was}
    return frozenset(parts), frozenset(unknown)


DISABLED, UNKNOWN_DISABLED = disabled_parts()


def module(part: str, kind: str) -> Any:
    """A feature's ``hooks``, ``state`` or ``messages`` module; None where it has none."""
    try:
        return importlib.import_module(f"{feature(part).package}.{kind}")
    except ModuleNotFoundError as error:
        if error.name != f"{feature(part).package}.{kind}":
            raise
        return None


def reset() -> None:
    """Forget what every feature counted and explained, and what it remembers of compiles that
    are over (for tests): each feature's state that has such things to forget has a ``reset``.
    Tables that follow live objects stay: their finalizers refer to them."""
    from stableguards.events import EVENTS

    EVENTS.reset()
    for part in PARTS:
        state = module(part, "state")
        forget = getattr(state.STATE, "reset", None) if state is not None else None
        if forget is not None:
            forget()
