"""Tables the benches print: named columns, right-aligned."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Column = tuple[str, Callable[[Any], Any]]  # (header, how to get the cell from a row)


def aligned(columns: Sequence[Column], rows: Sequence[Any]) -> str:
    """A header line and one line per row, each column right-aligned to its widest cell."""
    cells = [[name for name, _ in columns]] + [[str(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells)


def markdown(columns: Sequence[Column], rows: Sequence[Any]) -> str:
    """The same table in Markdown, for docs/benchmarks.md."""
    lines = [[name for name, _ in columns], ["---"] * len(columns)]
    lines += [[str(get(row)) for _, get in columns] for row in rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)
