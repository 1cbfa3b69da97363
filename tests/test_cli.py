"""python -m stableguards pgo show|diff|clear."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stableguards.cli import main
from stableguards.profiles.profile import DYNAMIC, CodeKey, Profile, SourceEntry, specialized, static
from stableguards.profiles.store import EngineStore
from stableguards.storage.engines import DirectoryEngine

CODE = CodeKey("0badc0de", 12, "train_step", None, "train.py")


def store_with(tmp_path, key, **entries) -> EngineStore:
    store = EngineStore(DirectoryEngine(tmp_path), prefix="")
    store.merge_write(key, Profile({CODE: entries}))
    return store


def test_show_lists_and_prints_a_table(tmp_path, capsys):
    store_with(tmp_path, "job:rank0",
               **{"L['x']": SourceEntry(DYNAMIC, (DYNAMIC, static(3)), (static(3), static(1))),
                  "L['n']": SourceEntry(specialized("range_refined_to_singleton"), DYNAMIC, DYNAMIC)})
    assert main(["--dir", str(tmp_path), "pgo", "show"]) == 0
    assert "job_rank0  1 frame(s), 2 source(s)" in capsys.readouterr().out
    assert main(["--dir", str(tmp_path), "pgo", "show", "job:rank0"]) == 0
    out = capsys.readouterr().out
    assert "train.py:12 train_step" in out
    assert "scalar specialized(range_refined_to_singleton)" in out
    assert "size=[dynamic, 3] stride=[3, 1]" in out
    assert "1 static" in out and "1 specialized" in out


def test_show_accepts_a_file_path(tmp_path, capsys):
    store = store_with(tmp_path, "job", **{"L['x']": SourceEntry(DYNAMIC, (DYNAMIC,), (static(1),))})
    assert main(["pgo", "show", str(tmp_path / store.name("job"))]) == 0
    assert "L['x']" in capsys.readouterr().out


def test_diff_names_what_changed(tmp_path, capsys):
    store_with(tmp_path, "a", **{"L['x']": SourceEntry(DYNAMIC, (static(4),), (static(1),))})
    store_with(tmp_path, "b", **{"L['x']": SourceEntry(DYNAMIC, (DYNAMIC,), (static(1),)),
                                 "L['y']": SourceEntry(static(2), DYNAMIC, DYNAMIC)})
    assert main(["--dir", str(tmp_path), "pgo", "diff", "a", "b"]) == 1
    out = capsys.readouterr().out
    assert "size=[4] stride=[1]" in out and "size=[dynamic] stride=[1]" in out
    assert "L['y']" in out and "scalar 2" in out
    assert main(["--dir", str(tmp_path), "pgo", "diff", "a", "a"]) == 0
    assert "no differences" in capsys.readouterr().out


def test_clear_removes_a_profile(tmp_path, capsys):
    store = store_with(tmp_path, "job", **{"L['x']": SourceEntry(DYNAMIC, (DYNAMIC,), (static(1),))})
    assert main(["--dir", str(tmp_path), "pgo", "clear", "job"]) == 0
    assert store.read("job") is None
    assert main(["--dir", str(tmp_path), "pgo", "clear", "job"]) == 1


def test_runs_as_a_module(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stableguards", "--dir", str(tmp_path), "pgo", "show"],
                          capture_output=True, text=True, check=True)
    assert "no profiles stored" in proc.stdout


def test_the_hook_table_in_the_docs_is_the_registrys(capsys):
    """docs/hooks.md holds `python -m stableguards hooks`'s output: derived, never hand-kept."""
    assert main(["hooks"]) == 0
    table = capsys.readouterr().out.strip()
    doc = (Path(__file__).resolve().parent.parent / "docs" / "hooks.md").read_text()
    begin, end = "<!-- hooks table: begin -->\n", "\n<!-- hooks table: end -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == table, "run python -m stableguards hooks"


def test_the_tables_in_benchmarks_md_are_made_from_their_data():
    """docs/benchmarks.md's generated tables are what bench/report.py makes from docs/data/."""
    root = Path(__file__).resolve().parent.parent
    assert "<!-- table: first_step -->" in (root / "docs" / "benchmarks.md").read_text()
    proc = subprocess.run([sys.executable, str(root / "bench" / "report.py"), "check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, "run python bench/report.py publish NAME " + proc.stderr[-2000:]


def test_the_parts_table_in_the_readme_is_the_registrys(capsys):
    assert main(["parts"]) == 0
    table = capsys.readouterr().out.strip()
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    begin, end = "<!-- parts table: begin -->\n", "\n<!-- parts table: end -->"
    assert readme[readme.index(begin) + len(begin):readme.index(end)] == table, "run python -m stableguards parts"


_AUDITED = '''
import enum, sys
import torch
torch._dynamo.config.stable_guards = True
lib = torch.library.Library("sg_audited", "DEF")
lib.define("twice(Tensor x) -> Tensor")
lib.impl("twice", lambda t: t * 2, "CompositeImplicitAutograd")


class Level(enum.IntEnum):
    HIGH = 3


def f(x):
    return torch.ops.sg_audited.twice(x) * Level.HIGH + hash("s") % 3


f.__module__ = "__main__"
torch.compile(f)(torch.ones(3))
'''


def test_the_audit_lists_what_each_saved_entry_trusts_and_what_that_covers(tmp_path):
    """An entry compiled with an enum member, a custom operator and a string's hash: the audit
    names the member by its value, the operator's kernels and the hash seed, each with what
    it covers, without importing the program it reads the entry of."""
    import pytest
    import torch._dynamo  # noqa: F401 - installs the hooks

    from stableguards.hooks import STATE

    if "warm_start" not in STATE.installed:
        pytest.skip("warm start needs torch 2.15")
    script = tmp_path / "audited.py"
    script.write_text(_AUDITED)
    env = {**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True, cwd=tmp_path)
    out = subprocess.run([sys.executable, "-m", "stableguards", "audit", "--cache-dir", str(tmp_path / "cache")],
                         env=env, check=True, capture_output=True, text=True).stdout
    assert "__main__.f" in out and "ID_MATCH on G['Level'].HIGH: enum:class:__main__.Level#" in out
    assert ".HIGH=int:3:int:3" in out and "its class, its name, its value" in out
    assert "OPERATOR_KERNELS on sg_audited.twice" in out and "every kernel of the operator" in out
    assert "HASH_SEED on str and bytes hashes" in out
