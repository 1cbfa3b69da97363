"""One process of the warm-start campaign: compile every case module, compare with eager.

    python tests/_warm_start_child.py SRC_DIR CASE [CASE ...]

Each case is a module SRC_DIR/<CASE>.py (written by tests/test_warm_start.py)
with ``build()``, returning the callable to compile and how to compile it.
Prints one JSON line: per case, whether every output equalled eager on fresh
inputs, how many frames Dynamo traced for it, and how often the counting
backend was called.
"""

from __future__ import annotations

import importlib
import json
import random
import sys

import torch
import torch._dynamo.utils as dynamo_utils

import stableguards

calls = {"counting": 0}


def counting(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    calls["counting"] += 1
    return gm.forward


def run_case(name: str) -> dict:
    module = importlib.import_module(name)
    fn, how = module.build()
    backend = counting if how.get("backend") == "counting" else how.get("backend", "inductor")
    before_frames = dynamo_utils.counters["frames"]["total"]
    before_calls = calls["counting"]
    if how.get("method"):  # model.compile(): the module compiles itself
        fn.compile(backend=backend, options=how.get("options"), dynamic=how.get("dynamic"))
        compiled = fn
    else:
        compiled = torch.compile(fn, backend=backend, options=how.get("options"), dynamic=how.get("dynamic"))
    gen = torch.Generator().manual_seed(7)
    matches = True
    for i in range(2):
        x = torch.randn(8, generator=gen)
        random.seed(i)  # a case that calls random.random() gets the same value in both calls
        got = compiled(x)
        random.seed(i)
        want = module.build()[0](x) if how.get("method") else fn(x)
        matches &= _close(got, want)
    if how.get("then_counting"):  # the same function, in the same process, under another backend
        again = torch.compile(fn, backend=counting)
        matches &= bool(torch.allclose(again(x), fn(x), rtol=1e-5, atol=1e-6))
    return {"matches": matches, "frames": dynamo_utils.counters["frames"]["total"] - before_frames,
            "counting_calls": calls["counting"] - before_calls}


def _close(got: object, want: object) -> bool:
    if isinstance(want, dict):  # an OrderedDict the compiled code builds again after the graph
        return type(got) is type(want) and got.keys() == want.keys() and all(
            _close(got[k], want[k]) for k in want)
    return bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6))


def main(src: str, names: list[str]) -> dict:
    sys.path.insert(0, src)
    torch._dynamo.config.stable_guards = True
    results = {name: run_case(name) for name in names}
    return {"cases": results, "counters": dict(stableguards.EVENTS.counters), "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
