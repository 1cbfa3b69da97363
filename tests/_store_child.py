"""One process of the shared-store tests: compile a small model, check it against eager.

    python tests/_store_child.py

The environment names the cache dir and the store (tests/test_shared_store.py).
Prints one JSON line: whether outputs equalled eager, the frames Dynamo traced, explain().
"""

from __future__ import annotations

import json

import torch
import torch._dynamo.symbolic_convert as symbolic_convert

import stableguards

TRACED: list[str] = []
_init = symbolic_convert.InstructionTranslator.__init__


def _count(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    TRACED.append(self.f_code.co_name)


symbolic_convert.InstructionTranslator.__init__ = _count


def main() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def fn(x):
        return model(x).softmax(-1)

    compiled = torch.compile(fn)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # an inference graph: its entry is saved when it compiles
        ok = bool(torch.allclose(compiled(x), fn(x), rtol=1e-5, atol=1e-6))
    return {"ok": ok, "traced": len(TRACED), "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main()))
