"""What a bench's figures were measured on, and the tables of docs/benchmarks.md made from them.

A bench writes its rows with ``write``: ``bench/out/NAME.json`` holds a header (the command, the
commit, torch, the CPU, the date, the bench) beside the rows.  ``docs/data/NAME.json`` is such a file kept
with the docs; each table of docs/benchmarks.md sits between ``<!-- table: NAME -->`` and
``<!-- table end -->`` and is made from it by the bench's ``COLUMNS`` (``columns.markdown``), or by
its own ``markdown(rows)`` where it has one:

    python bench/report.py publish first_step   # bench/out/first_step.json -> docs/data, docs table
    python bench/report.py check                # whether every docs table is what its data makes
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "benchmarks.md"
DATA = ROOT / "docs" / "data"
_BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- table end -->)", re.S)


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    except OSError:
        model = None
    return f"{model.group(1) if model else platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def header(argv: list[str]) -> dict[str, str]:
    import torch

    return {"command": " ".join(["python", os.path.relpath(argv[0], ROOT), *argv[1:]]), "commit": _commit(),
            "torch": torch.__version__, "cpu": _cpu(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def write(out: Path, name: str, rows: list[dict], args: list[str] | None = None) -> Path:
    """``out/NAME.json``: the header of this run (the bench's ``args``, its command line's by
    default) and ``rows``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    argv = [sys.argv[0], *(sys.argv[1:] if args is None else args)]
    path.write_text(json.dumps({"header": {**header(argv), "bench": Path(argv[0]).stem}, "rows": rows}, indent=2))
    return path


def render(name: str, data: dict) -> str:
    """The docs block for bench ``name``'s ``data``: its header line, then its table."""
    h = data["header"]
    sys.path.insert(0, str(HERE))
    from columns import markdown

    bench = importlib.import_module(h.get("bench", name))  # the bench that wrote it
    # Its own markdown(rows) where its table is more than its COLUMNS (first_step, restart_ab).
    table = bench.markdown(data["rows"]) if hasattr(bench, "markdown") else markdown(bench.COLUMNS, data["rows"])
    return (f"`{h['command']}` · commit {h['commit']} · torch {h['torch']} · {h['cpu']} · {h['date']}\n\n"
            f"{table}\n")


def generated(text: str) -> str:
    """docs/benchmarks.md's ``text`` with every table made from its data again (none where
    the bench has no data kept yet)."""
    def block(m: re.Match) -> str:
        data = DATA / f"{m.group(2)}.json"
        return m.group(1) + (render(m.group(2), json.loads(data.read_text())) if data.exists() else "") + m.group(4)

    return _BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    publish = sub.add_parser("publish", help="copy bench/out/NAME.json to docs/data and regenerate the docs")
    publish.add_argument("names", nargs="+")
    sub.add_parser("check", help="exit 1 if a docs table is not what its data makes")
    args = parser.parse_args(argv)
    text = DOCS.read_text()
    if args.command == "check":
        return 0 if generated(text) == text else 1
    DATA.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        (DATA / f"{name}.json").write_text((HERE / "out" / f"{name}.json").read_text())
        if f"<!-- table: {name} -->" not in text:
            text += f"\n<!-- table: {name} -->\n<!-- table end -->\n"
    DOCS.write_text(generated(text))
    print(f"{DOCS.relative_to(ROOT)}: tables of {', '.join(args.names)} made from docs/data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
