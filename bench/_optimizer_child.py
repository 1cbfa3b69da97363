"""One process of the optimizer table: compile one optimizer's step, print measurements as JSON.

    python bench/_optimizer_child.py OPTIMIZER N BACKEND [REPS]

The flag (TORCHDYNAMO_STABLE_GUARDS) and a fresh cache dir are set by
optimizer_table.py.  A compiled optimizer (parameters P) and an eager copy
(parameters Q, same start, same grads) step in lockstep throughout, so the
final comparison covers warm-up, timing and the schedule.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
import torch._dynamo.utils as dynamo_utils
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.callback import CallbackArgs, callback_handler
from torch._dynamo.convert_frame import input_codes

import stableguards

OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01),
}
WARMUP_STEPS = 3
SCHEDULE_STEPS = 100
PARAM_SHAPE = (8,)
# compilation_time_metrics keys (dynamo_timed) attributed to each frame compile.
PHASES = ("bytecode_tracing", "build_guards", "OutputGraph.call_user_compiler")


class PhaseTimes:
    """Seconds per dynamo_timed key, per compile id, from compile start/end callbacks."""

    def __init__(self) -> None:
        self.by_compile: dict[str, dict[str, float]] = {}
        self._start: dict[str, int] = {}
        callback_handler.register_start_callback(self._on_start)
        callback_handler.register_end_callback(self._on_end)

    def _on_start(self, args: CallbackArgs) -> None:
        self._start = {k: len(v) for k, v in dynamo_utils.compilation_time_metrics.items()}

    def _on_end(self, args: CallbackArgs) -> None:
        self.by_compile[args.compile_id] = {
            key: sum(values[self._start.get(key, 0):])
            for key, values in dynamo_utils.compilation_time_metrics.items()
        }


class LimitHits(logging.Handler):
    """Collects torch's "hit config.recompile_limit" warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("torch._dynamo.convert_frame").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "hit config." in message:
            self.messages.append(message.splitlines()[0])


def make_params(n: int, gen: torch.Generator) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.randn(PARAM_SHAPE, generator=gen)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(PARAM_SHAPE, generator=gen)
    return params


def clone_params(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, p in zip(copies, params):
        c.grad = p.grad.clone()
    return copies


def new_grads(compiled: list[torch.nn.Parameter], eager: list[torch.nn.Parameter],
              gen: torch.Generator) -> None:
    """The same fresh grads for both copies, written in place (as accumulation would)."""
    for p, q in zip(compiled, eager):
        g = torch.randn(PARAM_SHAPE, generator=gen)
        p.grad.copy_(g)
        q.grad.copy_(g)


def step_metrics(since: int = 0) -> list[Any]:
    """CompilationMetrics of installed compiles of an optimizer's ``step`` frame."""
    return [m for m in dynamo_utils.get_compilation_metrics()[since:]
            if m.co_name == "step" and m.has_guarded_code]


def find_code(metric: Any) -> Any:
    for ref in input_codes.seen:
        code = ref()
        if code is not None and (code.co_name, code.co_filename, code.co_firstlineno) == (
                metric.co_name, metric.co_filename, metric.co_firstlineno):
            return code
    raise LookupError(f"no input code for {metric.co_name} at {metric.co_filename}")


def guard_check_us(code: Any, f_locals: dict) -> dict:
    """Median microseconds of one ``guard_manager.check`` of the entry that passes."""
    entries = _debug_get_cache_entry_list(code)
    for grad_mode in (False, True):  # step runs under _use_grad: grad mode is off there
        with torch.set_grad_enabled(grad_mode):
            for entry in entries:
                if entry.guard_manager.check(f_locals):
                    us = _time_check(entry.guard_manager, f_locals)
                    return {"guard_check_us": us, "cache_entries": len(entries)}
    return {"guard_check_us": None, "cache_entries": len(entries)}


def _time_check(manager: Any, f_locals: dict, batches: int = 15, batch_s: float = 0.005) -> float:
    start = time.perf_counter()
    manager.check(f_locals)
    inner = max(1, int(batch_s / max(time.perf_counter() - start, 1e-7)))
    samples = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(inner):
            manager.check(f_locals)
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples) * 1e6


def time_steps(compiled_step: Callable[[], Any], eager_step: Callable[[], Any],
               reps: int) -> dict:
    """Median seconds per step, compiled and eager interleaved so both see the same noise."""
    compiled, eager = [], []
    for _ in range(reps):
        start = time.perf_counter()
        compiled_step()
        compiled.append(time.perf_counter() - start)
        start = time.perf_counter()
        eager_step()
        eager.append(time.perf_counter() - start)
    return {"compiled_step_us": statistics.median(compiled) * 1e6,
            "eager_step_us": statistics.median(eager) * 1e6}


def frame_compile(metric: Any, phases: PhaseTimes) -> dict:
    times = phases.by_compile.get(metric.compile_id, {})
    return {
        "compile_id": metric.compile_id,
        "guard_count": metric.guard_count,
        "guard_latency_us": metric.guard_latency_us,
        "entire_frame_compile_s": metric.entire_frame_compile_time_s,
        "tracing_s": times.get("bytecode_tracing"),
        "build_guards_s": times.get("build_guards"),
        "backend_s": times.get("OutputGraph.call_user_compiler"),
    }


def make_schedulers(schedule: str, opts: tuple) -> list:
    """onecycle: lr and momentum/betas change every step.  plateau: ReduceLROnPlateau fed
    a constant metric, halving lr every 3 steps."""
    if schedule == "onecycle":
        return [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=SCHEDULE_STEPS) for o in opts]
    if schedule == "plateau":
        return [torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=2) for o in opts]
    raise ValueError(f"unknown schedule {schedule!r}")


def run_schedule(opt: torch.optim.Optimizer, eager_opt: torch.optim.Optimizer,
                 compiled_step: Callable[[], Any], params: list, eager_params: list,
                 gen: torch.Generator, limit_hits: LimitHits, schedule: str) -> dict:
    """SCHEDULE_STEPS scheduler steps in lockstep with an eager copy."""
    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
    schedulers = make_schedulers(schedule, (opt, eager_opt))
    since = len(dynamo_utils.get_compilation_metrics())
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    hits = len(limit_hits.messages)
    compiled, eager = [], []
    for _ in range(SCHEDULE_STEPS):
        new_grads(params, eager_params, gen)
        start = time.perf_counter()
        compiled_step()
        compiled.append(time.perf_counter() - start)
        start = time.perf_counter()
        eager_opt.step()
        eager.append(time.perf_counter() - start)
        for scheduler in schedulers:
            scheduler.step(1.0) if schedule == "plateau" else scheduler.step()
    metrics = dynamo_utils.get_compilation_metrics()[since:]
    limit_failures = [m for m in metrics if "recompile limit" in (m.fail_reason or "").lower()]
    return {
        "schedule": schedule,
        "schedule_step_compiles": len(step_metrics(since)),
        "schedule_frames_compiled": sum(1 for m in metrics if m.has_guarded_code),
        "schedule_graphs": dynamo_utils.counters["stats"]["unique_graphs"] - graphs,
        "schedule_limit_hit": len(limit_hits.messages) > hits or bool(limit_failures),
        "schedule_limit_messages": limit_hits.messages[hits:],
        "schedule_compiled_s": sum(compiled),
        # Medians: the steps that compiled are the exceptions, unless every step compiles.
        "schedule_step_ratio": statistics.median(compiled) / statistics.median(eager),
        "recompile_reasons": [m.recompile_reason.splitlines()[0] for m in metrics
                              if m.recompile_reason][:10],
    }


OPT: torch.optim.Optimizer | None = None


def train_step() -> None:
    OPT.step()


def main(name: str, n: int, backend: str, reps: int, schedule: str) -> dict:
    phases, limit_hits = PhaseTimes(), LimitHits()
    gen = torch.Generator().manual_seed(0)
    params = make_params(n, gen)
    eager_params = clone_params(params)
    opt, eager_opt = OPTIMIZERS[name](params), OPTIMIZERS[name](eager_params)
    # As a training script calls it: a compiled function that steps the module's
    # optimizer.  (Reached through a closure or as torch.compile(opt.step), the
    # hyperparameters are traced differently and upstream does not recompile for them.)
    global OPT
    OPT = opt
    compiled_step = torch.compile(train_step, backend=backend)

    for _ in range(WARMUP_STEPS):
        compiled_step()
        eager_opt.step()
    warmup = step_metrics()
    if not warmup:
        raise RuntimeError("no compiled frame named 'step' after warm-up")
    steady = warmup[-1]  # the compile whose code runs from here on

    result = {
        "optimizer": name,
        "n": n,
        "backend": backend,
        "flag": bool(torch._dynamo.config.stable_guards),
        "recompile_limit": torch._dynamo.config.recompile_limit,
        "warmup_step_compiles": len(warmup),
        **frame_compile(steady, phases),
        **guard_check_us(find_code(steady), {"self": opt, "closure": None}),
        **time_steps(compiled_step, eager_opt.step, reps),
    }
    result["overhead_us"] = result["compiled_step_us"] - result["eager_step_us"]
    result["overhead_ratio"] = result["compiled_step_us"] / result["eager_step_us"]
    result.update(run_schedule(opt, eager_opt, compiled_step, params, eager_params, gen, limit_hits, schedule))
    result["matches_eager"] = all(torch.allclose(p, q, rtol=1e-4, atol=1e-5)
                                  for p, q in zip(params, eager_params))
    result["max_abs_diff"] = max((p - q).abs().max().item() for p, q in zip(params, eager_params))
    result["explain"] = stableguards.explain()
    return result


if __name__ == "__main__":
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 50
    schedule = sys.argv[5] if len(sys.argv) > 5 else "onecycle"
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], reps, schedule)))
