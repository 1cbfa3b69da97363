"""One process of the shared-store tests: compile a small model, check it against eager.

    python tests/_store_child.py

The environment names the cache dir and the store (tests/test_shared_store.py), and the flag
(or STORE_CHILD_PATCH_FLAG: set with ``config.patch`` in the main thread only).
Prints one JSON line: whether outputs (and with STORE_CHILD_TRAIN, gradients) equalled eager,
the frames Dynamo traced, the seconds torch.compile() took (a wait for another process's
entry), torch's cache counters, explain().
"""

from __future__ import annotations

import json
import os
import time

import torch

import stableguards
from torch._dynamo.utils import counters
from _traced import names as traced


def main() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def fn(x):
        return model(x).softmax(-1)

    gate = os.environ.get("STORE_CHILD_GATE")  # a test that acts between start-up and compile
    if gate:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        pick_vec_isa()  # start-up: inductor's probe of the CPU (seconds in an empty cache dir)
        open(gate + ".ready", "w").close()
        while not os.path.exists(gate):
            time.sleep(0.05)
    start = time.monotonic()
    compiled = torch.compile(fn)  # where a process waits for an entry another is compiling
    waited_s = time.monotonic() - start
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    # An inference graph: its entry is saved when it compiles.  STORE_CHILD_GRAD: a training
    # graph whose backward never runs (its entry waits for it), then STORE_CHILD_LINGER_S idle.
    if os.environ.get("STORE_CHILD_TRAIN"):  # a forward and its backward (an AOTAutograd entry)
        ok = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                 for a, b in zip(_grads(compiled, model, x), _grads(fn, model, x), strict=True))
    else:
        with torch.set_grad_enabled(bool(os.environ.get("STORE_CHILD_GRAD"))):
            ok = bool(torch.allclose(compiled(x), fn(x), rtol=1e-5, atol=1e-6))
    time.sleep(float(os.environ.get("STORE_CHILD_LINGER_S", "0")))
    caches = {name: dict(counters[name]) for name in ("inductor", "aot_autograd")}
    return {"ok": ok, "traced": len(traced()), "waited_s": waited_s, "counters": caches,
            "explain": stableguards.explain()}


def _grads(fn, model, x):
    model.zero_grad()
    fn(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


if __name__ == "__main__":
    if os.environ.get("STORE_CHILD_PATCH_FLAG"):  # the flag set in code, for this thread only
        with torch._dynamo.config.patch(stable_guards=True):
            print(json.dumps(main()))
    else:
        print(json.dumps(main()))
