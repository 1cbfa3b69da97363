"""One process of tests/test_graph_params.py: an optimizer step whose graph takes the
parameters (and state) as graph attributes, compiled with the flag on, beside eager.

    python tests/_graph_params_child.py SCENARIO

SCENARIO says what the process's model and optimizer are (the cold process runs
"plain" or "adam"): ``plain`` (SGD over two parameters, views into two
storages), ``reshaped`` (the second parameter has another shape), ``aliased``
(the two parameters are views of one storage, at the same offsets), ``adam``
(Adam restored from a checkpoint), ``adam_fresh`` (Adam, state made by its
first step), ``adam_strided_state`` (a state tensor of the checkpoint laid out
column by column).  Prints one JSON line: whether every loss and the final
parameters equal eager, the frames Dynamo traced, and explain().
"""

from __future__ import annotations

import json
import sys

import torch

import stableguards
from _traced import names

torch._dynamo.config.stable_guards = True


def _params(scenario: str) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    first, second = torch.randn(8), torch.randn(8)
    if scenario == "aliased":  # as "plain" (the same offsets), but one storage
        second = first
    if scenario == "reshaped":
        return [torch.nn.Parameter(first[:4].view(2, 2)), torch.nn.Parameter(second[4:].view(4, 1))]
    return [torch.nn.Parameter(first[:4].view(2, 2)), torch.nn.Parameter(second[4:])]


def _optimizer(params: list[torch.nn.Parameter], scenario: str) -> torch.optim.Optimizer:
    if not scenario.startswith("adam"):
        return torch.optim.SGD(params, lr=0.1)
    opt = torch.optim.Adam(params, lr=0.1)
    if scenario != "adam_fresh":  # a checkpoint's state: two eager steps on copies of the parameters
        scratch = [torch.nn.Parameter(p.detach().clone()) for p in params]
        source = torch.optim.Adam(scratch, lr=0.1)
        for _ in range(2):
            sum(p.pow(2).sum() for p in scratch).backward()
            source.step()
        opt.load_state_dict(source.state_dict())
        if scenario == "adam_strided_state":  # the same values, laid out column by column
            exp_avg = opt.state[params[0]]["exp_avg"]
            opt.state[params[0]]["exp_avg"] = exp_avg.t().contiguous().t()
    return opt


def main(scenario: str) -> dict:
    results = []
    for compiled in (True, False):
        params = _params(scenario)
        opt = _optimizer(params, scenario)

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = (params[0] * x.view(2, 2)).pow(2).sum() + (params[1].flatten() * x).pow(2).sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        run = torch.compile(step) if compiled else step
        losses = [run(torch.full((4,), float(i + 1))) for i in range(3)]
        results.append(losses + [p.detach().clone() for p in params])
    equal = all(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5) for a, b in zip(*results, strict=True))
    return {"equal": bool(equal), "traced": names(), "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
