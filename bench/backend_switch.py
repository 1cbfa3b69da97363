"""Backend switching and lifetime scenarios: compiles and outcomes, flag off vs on.

    python bench/backend_switch.py

Every scenario runs twice in this process, after torch._dynamo.reset(), once
per flag setting.  "wrong" counts calls that returned another backend's result.

Writes bench/out/backend_switch.json.
"""

from __future__ import annotations

import argparse
import gc
import sys
import weakref
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd

import report
import stableguards  # noqa: F401 - registers the flag
from columns import aligned

HERE = Path(__file__).resolve().parent


def f(x):
    return x + x


class Scaled:
    """Output shows which backend compiled the code; __eq__ is careless, as in the wild."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, gm, example_inputs):
        return lambda *args: [out * self.scale for out in gm.forward(*args)]

    def __eq__(self, other):
        return isinstance(other, Scaled)

    __hash__ = None


class ScaledHashable(Scaled):
    """The common pattern: a loose __eq__ and a __hash__ to match it."""

    def __hash__(self):
        return hash(type(self))


def make_factory(scale):
    class Factory:
        def __call__(self, gm, example_inputs):
            return lambda *args: [out * scale for out in gm.forward(*args)]

    return Factory()


class Keyed(Scaled):
    """Opts in with an explicit key; the key decides the scale."""

    def __init__(self, key):
        super().__init__(2)
        self._torchdynamo_cache_key = key


def nop(gm, example_inputs):
    return gm.forward


def counters_see_their_compiles() -> dict:
    from torch._dynamo.testing import CompileCounter

    first, second = CompileCounter(), CompileCounter()
    return {**run([first, second]), "wrong": int(second.frame_count != 1)}


def compiles() -> int:
    # Not get_compilation_metrics(): it keeps only the most recent 64.
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def run(backends, expected=None) -> dict:
    x = torch.ones(2)
    before, wrong = compiles(), 0
    for i, backend in enumerate(backends):
        out = torch.compile(f, backend=backend)(x)
        if expected is not None and out[0].item() != expected[i]:
            wrong += 1
    return {"compiles": compiles() - before, "wrong": wrong}


def leak() -> str:
    def local(x):
        return x.sin()

    backend = aot_autograd(fw_compiler=nop)
    ref = weakref.ref(backend)
    compiled = torch.compile(local, backend=backend)
    compiled(torch.ones(2))
    del compiled, backend
    gc.collect()
    return "alive" if ref() is not None else "collected"


SCENARIOS = {
    "eager, eager (two torch.compile calls)": lambda: run(["eager", "eager"]),
    "eager, aot_eager, eager": lambda: run(["eager", "aot_eager", "eager"]),
    "aot_autograd(fw_compiler=nop) x3, kept": lambda: run([aot_autograd(fw_compiler=nop) for _ in range(3)]),
    "Scaled(2), Scaled(3), Scaled(2) (loose __eq__)": lambda: run([Scaled(2), Scaled(3), Scaled(2)], [4, 6, 4]),
    "make(2), make(3): a class made per call": lambda: run([make_factory(2), make_factory(3)], [4, 6]),
    "Scaled(2), Scaled(3) with __eq__ and __hash__": lambda: run([ScaledHashable(2), ScaledHashable(3)], [4, 6]),
    "CompileCounter() twice (wrong: 2nd saw no compile)": counters_see_their_compiles,
    "Keyed('k') x3, kept (explicit key)": lambda: run([Keyed("k") for _ in range(3)]),
    "10 backends, recompile_limit=8": lambda: _limited(),
}


def _limited() -> dict:
    with torch._dynamo.config.patch(recompile_limit=8):
        scales = list(range(2, 12))
        return run([Scaled(s) for s in scales], [2 * s for s in scales])


def outcome(cell: dict) -> str:
    """A scenario's compiles (and wrong results), or what became of the backend."""
    if "backend" in cell:
        return cell["backend"]
    return f"{cell['compiles']} compiles" + (f", {cell['wrong']} wrong" if cell["wrong"] else "")


COLUMNS = (
    ("scenario", lambda r: r["scenario"]),
    ("flag off", lambda r: outcome(r["off"])),
    ("flag on", lambda r: outcome(r["on"])),
)


def by_flag(measure) -> dict:
    """``measure()``'s result with the flag off and on, each after torch._dynamo.reset()."""
    cells = {}
    for flag in (False, True):
        torch._dynamo.reset()
        with torch._dynamo.config.patch(stable_guards=flag):
            cells["on" if flag else "off"] = measure()
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    rows = [{"scenario": name, **by_flag(scenario)} for name, scenario in SCENARIOS.items()]
    rows.append({"scenario": "backend after del + gc (no reset)", **by_flag(lambda: {"backend": leak()})})
    print(aligned(COLUMNS, rows))
    # stderr: tests/test_backend_match.py reads the table from stdout.
    print(f"rows: {report.write(args.out, 'backend_switch', rows, argv)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
