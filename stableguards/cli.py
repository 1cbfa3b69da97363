"""``python -m stableguards pgo show|diff|clear``: look at and manage stored profiles;
``python -m stableguards audit``: what each saved warm-start entry trusts by identity;
``python -m stableguards hooks`` and ``parts``: the tables of the torch seams stableguards
hooks and of its parts.

A profile is named by its key (as stored by the store compiles use: ``pgo/`` in
STABLEGUARDS_STORE or in the store under the inductor cache dir, or Redis when
STABLEGUARDS_PGO_REDIS_URL or --redis is given) or by the path of a profile file.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from stableguards.profiles.profile import Profile, State
from stableguards.registry import parts_table
from stableguards.profiles.store import EngineStore, ProfileStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stableguards")
    parser.add_argument("--redis", metavar="URL", help="Redis store (default: "
                        "$STABLEGUARDS_PGO_REDIS_URL, else the configured store)")
    parser.add_argument("--dir", metavar="DIR", help="a directory of profile files (default: "
                        "<inductor cache dir>/stableguards/store/pgo)")
    commands = parser.add_subparsers(dest="area", required=True)
    pgo = commands.add_parser("pgo", help="PGO profiles").add_subparsers(dest="command", required=True)
    show = pgo.add_parser("show", help="print a profile as a table (or list the stored keys)")
    show.add_argument("profile", nargs="?", help="key or file; omit to list what is stored")
    diff = pgo.add_parser("diff", help="what differs between two profiles")
    diff.add_argument("a", help="key or file")
    diff.add_argument("b", help="key or file")
    clear = pgo.add_parser("clear", help="remove a stored profile")
    clear.add_argument("profile", help="key or file")
    audit = commands.add_parser("audit", help="what each saved warm-start entry trusts by identity, and what "
                                              "that identity covers")
    audit.add_argument("--cache-dir", metavar="DIR", help="the inductor cache dir the entries were saved from "
                       "(default: $TORCHINDUCTOR_CACHE_DIR, else torch's); entries come from "
                       "$STABLEGUARDS_STORE when it is set")
    commands.add_parser("hooks", help="print the table of torch seams stableguards hooks (markdown)")
    commands.add_parser("parts", help="print the table of stableguards' parts (markdown)")
    args = parser.parse_args(argv)
    if args.area == "hooks":
        from stableguards.hooks import hook_table

        print(hook_table())
        return 0
    if args.area == "parts":
        print(parts_table())
        return 0
    if args.area == "audit":
        return _audit(args.cache_dir)

    store = _store(args)
    if args.command == "show":
        if args.profile is None:
            return _list(store)
        return _show(*_load(store, args.profile))
    if args.command == "diff":
        return _diff(_load(store, args.a), _load(store, args.b))
    return _clear(store, args.profile)


def _audit(cache_dir: str | None) -> int:
    """Every saved entry's trusted identities and unguarded facts (warm_start.audit)."""
    from stableguards.hooks.core import cache_subdir
    from stableguards.storage import configured
    from stableguards.warm_start.audit import report
    from stableguards.warm_start.hooks.saved import saved_proofs

    root = Path(cache_dir) / "stableguards" if cache_dir else cache_subdir("warm_start").parent
    print(report(saved_proofs(root / "warm_start", configured(root / "store"))))
    return 0


def _store(args: argparse.Namespace) -> ProfileStore:
    from stableguards.storage import redis_engine
    from stableguards.storage.engines import DirectoryEngine

    if args.redis:
        return EngineStore(redis_engine(args.redis))
    if args.dir:
        return EngineStore(DirectoryEngine(args.dir), prefix="")
    from stableguards.profiles.hooks import profile_store  # the store compiles use

    store = profile_store()
    if store is None:
        raise SystemExit("no profile store: torch's automatic_dynamic_local_pgo is off or "
                         "STABLEGUARDS_PGO_REDIS_URL is unusable (see any warning above); "
                         "name one with --dir or --redis")
    return store


def _resolve(store: ProfileStore, name: str) -> tuple[ProfileStore, str]:
    """A file path names a profile in its own directory; anything else is a key."""
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        from stableguards.storage.engines import DirectoryEngine

        return EngineStore(DirectoryEngine(path.parent), prefix=""), path.stem
    return store, name


def _load(store: ProfileStore, name: str) -> tuple[str, Profile]:
    store, key = _resolve(store, name)
    profile = store.read(key)
    if profile is None:
        raise SystemExit(f"no usable profile at {store.describe(key)}")
    return store.describe(key), profile


def _list(store: ProfileStore) -> int:
    keys = store.keys()
    if not keys:
        print("no profiles stored")
    for key in keys:
        profile = store.read(key)
        size = f"{len(profile.frames)} frame(s), {len(profile)} source(s)" if profile else "unusable"
        print(f"{key}  {size}  {store.describe(key)}")
    return 0


def _show(where: str, profile: Profile) -> int:
    print(where)
    rows = [(f"{code.filename}:{code.firstlineno} {code.name}", name, str(entry))
            for code, name, entry in profile.entries()]
    _print_table(("frame", "source", "state"), rows)
    states = Counter(dim.state for _, _, entry in profile.entries() for dim in entry.dims())
    print(", ".join(f"{states[s]} {s.name.lower()}" for s in State if s != State.UNSET and states[s])
          or "empty profile")
    return 0


def _diff(a: tuple[str, Profile], b: tuple[str, Profile]) -> int:
    (where_a, pa), (where_b, pb) = a, b
    entries_a = {(code, name): entry for code, name, entry in pa.entries()}
    entries_b = {(code, name): entry for code, name, entry in pb.entries()}
    rows = []
    for code, name in sorted(entries_a.keys() | entries_b.keys(),
                             key=lambda k: (k[0].sort_key(), k[1])):
        ea, eb = entries_a.get((code, name)), entries_b.get((code, name))
        if ea != eb:
            rows.append((f"{code.filename}:{code.firstlineno} {code.name}", name,
                         "-" if ea is None else str(ea), "-" if eb is None else str(eb)))
    print(f"a: {where_a}\nb: {where_b}")
    if not rows:
        print("no differences")
        return 0
    _print_table(("frame", "source", "a", "b"), rows)
    return 1


def _clear(store: ProfileStore, name: str) -> int:
    store, key = _resolve(store, name)
    if store.clear(key):
        print(f"removed {store.describe(key)}")
        return 0
    print(f"no profile at {store.describe(key)}")
    return 1


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
