"""Backend switching and lifetime scenarios: compiles and outcomes, flag off vs on.

    python bench/backend_switch.py

Every scenario runs twice in this process, after torch._dynamo.reset(), once
per flag setting.  "wrong" counts calls that returned another backend's result.
"""

from __future__ import annotations

import gc
import weakref

import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd

import stableguards  # noqa: F401 - registers the flag


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


def counters_see_their_compiles() -> tuple[int, int]:
    from torch._dynamo.testing import CompileCounter

    first, second = CompileCounter(), CompileCounter()
    compiled, wrong = run([first, second])
    return compiled, int(second.frame_count != 1)


def compiles() -> int:
    # Not get_compilation_metrics(): it keeps only the most recent 64.
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def run(backends, expected=None) -> tuple[int, int]:
    x = torch.ones(2)
    before, wrong = compiles(), 0
    for i, backend in enumerate(backends):
        out = torch.compile(f, backend=backend)(x)
        if expected is not None and out[0].item() != expected[i]:
            wrong += 1
    return compiles() - before, wrong


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


def _limited() -> tuple[int, int]:
    with torch._dynamo.config.patch(recompile_limit=8):
        scales = list(range(2, 12))
        return run([Scaled(s) for s in scales], [2 * s for s in scales])


def main() -> None:
    rows = []
    for name, scenario in SCENARIOS.items():
        cells = []
        for flag in (False, True):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(stable_guards=flag):
                compiled, wrong = scenario()
            cells.append(f"{compiled} compiles" + (f", {wrong} wrong" if wrong else ""))
        rows.append((name, *cells))
    cells = []
    for flag in (False, True):
        torch._dynamo.reset()
        with torch._dynamo.config.patch(stable_guards=flag):
            cells.append(leak())
    rows.append(("backend after del + gc (no reset)", *cells))
    width = max(len(r[0]) for r in rows)
    print(f"{'scenario':<{width}}  {'flag off':<22}  flag on")
    for name, off, on in rows:
        print(f"{name:<{width}}  {off:<22}  {on}")


if __name__ == "__main__":
    main()
