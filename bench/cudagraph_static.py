"""Cudagraphs under stable_guards: is a moved static input named, and does strict mode raise?

    python bench/cudagraph_static.py

Needs CUDA; without it, it says so and exits 0.  Trains a small nn.Linear with
Adam, the step (forward, backward, opt.step) compiled with
mode="reduce-overhead", then rebinds a parameter's storage
(p.data = p.data.clone()) so the address baked into the cudagraphs is stale.
torch re-records silently; stableguards should log a warning naming the moved
parameter by its Dynamo source, or raise StaticInputMoved when
stableguards.cudagraphs.strict_static_inputs is on.  "re-records" counts graphs
torch recorded after the move (CUDAGraphTreeManager.record_function calls).
In the whole-step scenarios the grads come out of the recorded backward graph,
so cudagraphs treat them as static and copy none; "step only" compiles just
opt.step after an eager backward, so one warning must say its grads are copied.
Exits 1 if a scenario did not behave as expected.

Writes bench/out/cudagraph_static.json.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

import report
from columns import aligned

HERE = Path(__file__).resolve().parent
STEPS = 4
# The Dynamo source of the rebound parameter, as the warning must name it.
MOVED = "_parameters['weight']"


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def count_recordings(counter: list[int]) -> None:
    """Count every cudagraph torch records, whether or not stableguards notices."""
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    original = CUDAGraphTreeManager.record_function

    def record_function(self, *args, **kwargs):
        counter[0] += 1
        return original(self, *args, **kwargs)

    CUDAGraphTreeManager.record_function = record_function


def scenario(name: str, strict: bool, recordings: list[int], whole_step: bool = True) -> dict:
    """whole_step: forward, backward and step compiled together; else only opt.step is,
    after an eager backward, so its grads are not cudagraph outputs and get copied."""
    import stableguards
    from stableguards.cudagraphs.checks import StaticInputMoved

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    stableguards.cudagraphs.strict_static_inputs = strict
    model = torch.nn.Linear(64, 64, device="cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device="cuda")

    compiled_step = torch.compile(opt.step, mode="reduce-overhead")

    @torch.compile(mode="reduce-overhead")
    def whole() -> None:
        model(x).square().mean().backward()
        opt.step()

    def step_only() -> None:
        model(x).square().mean().backward()
        compiled_step()

    train_step = whole if whole_step else step_only

    def run(steps: int) -> None:
        for _ in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            train_step()
            opt.zero_grad(set_to_none=True)

    handler = Collect()
    logging.getLogger("stableguards").addHandler(handler)
    error = ""
    try:
        run(STEPS)
        before_move = recordings[0]
        model.weight.data = model.weight.data.clone()
        try:
            run(STEPS)
        except StaticInputMoved as e:
            error = str(e)
        torch.cuda.synchronize()
    finally:
        logging.getLogger("stableguards").removeHandler(handler)
        stableguards.cudagraphs.strict_static_inputs = False

    moves = [m for m in handler.messages if " -> 0x" in m]
    return {
        "scenario": name,
        "weight_warnings": sum(MOVED in m for m in moves),
        "rerecords": recordings[0] - before_move,
        "raised": bool(error),
        "copied_warnings": sum("copied" in m for m in handler.messages),
        "messages": handler.messages,
        "error": error,
        "inductor_counters": dict(torch._dynamo.utils.counters["inductor"]),
    }


def as_expected(row: dict) -> bool:
    if row["scenario"] == "strict":
        return MOVED in row["error"]
    if row["scenario"] == "step only":
        return row["copied_warnings"] == 1 and not row["raised"]
    return row["weight_warnings"] >= 1 and not row["raised"]


COLUMNS = (
    ("scenario", lambda r: r["scenario"]),
    ("warnings naming the weight", lambda r: r["weight_warnings"]),
    ("re-records", lambda r: r["rerecords"]),
    ("raised", lambda r: "yes" if r["raised"] else "no"),
    ("grads copied warnings", lambda r: r["copied_warnings"]),
    ("as expected", lambda r: "yes" if as_expected(r) else "NO"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("cudagraph_static: CUDA is not available, nothing to measure (needs a GPU).")
        return 0
    import stableguards  # noqa: F401 - registers the flag and hooks

    torch._dynamo.config.stable_guards = True
    recordings = [0]
    count_recordings(recordings)
    rows = [scenario("rebind param", False, recordings), scenario("strict", True, recordings),
            scenario("step only", False, recordings, whole_step=False)]

    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'cudagraph_static', rows, argv)}")
    return 0 if all(as_expected(row) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
