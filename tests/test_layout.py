"""The package's shape, checked on its source: no part imports another part's package.

A part (``registry.PARTS``) may import the core (``stableguards.hooks``), the shared
modules (every other module or package outside the parts: ``identity``, ``storage``,
``events``, ``components`` ...) and itself.  What two parts both need is shared code; what one
part tells another goes through a slot (``hooks.seams``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from stableguards import registry

PACKAGE = Path(__file__).resolve().parents[1] / "stableguards"


def _imports(path: Path) -> list[str]:
    """The stableguards modules ``path`` imports, absolute."""
    module = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module[:-1]
    if path.name == "__init__.py":
        module = module[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found += [name] if node.module else [f"{name}.{alias.name}" for alias in node.names]
    return [name for name in found if name.split(".")[0] == "stableguards"]


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in registry.PARTS else None


def part_edges() -> list[tuple[str, str]]:
    """(importing file, imported module) for every import from one part's package into another's."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _part(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        if here is None:
            continue
        edges += [(str(path.relative_to(PACKAGE.parent)), name) for name in _imports(path)
                  if _part(name) not in (None, here)]
    return edges


def core_edges() -> list[tuple[str, str]]:
    """Imports of a part's package from the core or a shared module (the CLI aside: it is the
    user's entry point to every part)."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if _part(module) is not None or module in ("stableguards.cli", "stableguards.__init__",
                                                   "stableguards.registry"):
            continue
        edges += [(str(path.relative_to(PACKAGE.parent)), name) for name in _imports(path) if _part(name)]
    return edges


def test_no_part_imports_another_parts_package():
    assert part_edges() == []


def test_the_core_and_shared_modules_import_no_part():
    assert core_edges() == []


def test_the_check_sees_an_edge(tmp_path, monkeypatch):
    fake = tmp_path / "stableguards"
    (fake / "keys").mkdir(parents=True)
    (fake / "keys" / "hooks.py").write_text("from stableguards.warm_start.state import STATE\n"
                                            "from ..profiles import messages\nfrom . import ledger\n")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert part_edges() == [("stableguards/keys/hooks.py", "stableguards.warm_start.state"),
                            ("stableguards/keys/hooks.py", "stableguards.profiles")]


def test_no_module_is_over_400_lines():
    """Short modules named for what they do: a module past this is doing more than one thing."""
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}
