"""A randomized false-hit campaign for BACKEND_MATCH (issue 9).

Generated backends of every kind, compiled over a few functions in a random
order of switches, flag on.  Every compiled function records which
configuration compiled it when it runs, so a false hit shows even where two
backends happen to scale alike; every output is checked against the result
that backend itself gives; every stateful backend must have seen its own
compiles.

    STABLEGUARDS_CAMPAIGN_EXAMPLES=500 pytest tests/test_backend_campaign.py   # a long run
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import register_backend

import stableguards  # noqa: F401 - registers the flag

EXAMPLES = int(os.environ.get("STABLEGUARDS_CAMPAIGN_EXAMPLES", "40"))

# What ran: the configuration token of the code each compiled call executed.
RAN: list[Any] = []
# What compiled: the token of each stateful backend when it is asked to compile.
COMPILED: list[Any] = []
_serial = itertools.count()


def scaled(gm: Any, token: Any, scale: int) -> Any:
    """Code that says who compiled it, and scales the graph's outputs."""
    def run(*args: Any) -> Any:
        RAN.append(token)
        return [out * scale for out in gm.forward(*args)]

    return run


# --- the kinds of backend --------------------------------------------------------
# Each maker returns (backend object, token of its equivalence class, scale).  Two
# backends may share code only when their tokens are equal.

@register_backend(name="stableguards_campaign")
def _registered(gm: Any, example_inputs: Any, options: dict | None = None) -> Any:
    scale = (options or {})["scale"]
    return scaled(gm, ("registered", scale), scale)


def registered(scale: int) -> tuple:
    return "stableguards_campaign", ("registered", scale), scale, {"options": {"scale": scale}}


def factory_class(scale: int) -> tuple:
    token = ("factory", next(_serial))

    class Factory:  # a class made per call, closing over the scale and the token
        def __call__(self, gm: Any, example_inputs: Any) -> Any:
            return scaled(gm, token, scale)

    return Factory(), token, scale, {}


def closure(scale: int) -> tuple:
    token = ("closure", next(_serial))

    def backend(gm: Any, example_inputs: Any) -> Any:
        return scaled(gm, token, scale)

    return backend, token, scale, {}


def _partial_target(gm: Any, example_inputs: Any, token: Any, scale: int) -> Any:
    return scaled(gm, token, scale)


def partial(scale: int) -> tuple:
    token = ("partial", next(_serial))
    return functools.partial(_partial_target, token=token, scale=scale), token, scale, {}


class Stateful:
    """Counts its compiles per function; its scale may change between compiles."""

    def __init__(self, scale: int) -> None:
        self.scale = scale
        self.token = ("stateful", next(_serial))
        self.compiled: set[str] = set()

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.compiled.add(gm.code)
        COMPILED.append(self.token)
        return scaled(gm, self.token, self.scale)


def stateful(scale: int) -> tuple:
    backend = Stateful(scale)
    return backend, backend.token, scale, {}


class LooseEq(Stateful):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, LooseEq)

    def __hash__(self) -> int:
        return 0


class LooseEqNoHash(Stateful):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, LooseEqNoHash)

    __hash__ = None  # type: ignore[assignment]


def loose_eq(scale: int) -> tuple:
    backend = LooseEq(scale)
    return backend, backend.token, scale, {}


def loose_eq_no_hash(scale: int) -> tuple:
    backend = LooseEqNoHash(scale)
    return backend, backend.token, scale, {}


def _fw_compiler(scale: int) -> Any:
    token = ("aot", scale)

    def fw_compiler(gm: Any, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            RAN.append(token)
            return tuple(out * scale for out in gm(*args))

        return run

    return fw_compiler


# A pool of compilers that lives for the session: aot_autograd backends built
# around the same one are equivalent (rule 2), around different ones not.
FW_COMPILERS = {scale: _fw_compiler(scale) for scale in range(2, 6)}


def aot(scale: int) -> tuple:
    return aot_autograd(fw_compiler=FW_COMPILERS[scale]), ("aot", scale), scale, {}


KEY_SCALES = {"k2": 2, "k3": 3, ("k", 4): 4}


class Keyed(Stateful):
    """Opts in: the key decides what it compiles (the user's promise)."""

    def __init__(self, key: Any, scale: int) -> None:
        super().__init__(KEY_SCALES.get(key, scale))
        self._torchdynamo_cache_key = key
        if key in KEY_SCALES:
            self.token = ("key", key)


def keyed(scale: int, *, key: Any) -> tuple:
    backend = Keyed(key, scale)
    return backend, backend.token, backend.scale, {}


KINDS = [registered, factory_class, closure, partial, stateful, loose_eq, loose_eq_no_hash, aot]
KEYS = ["k2", "k3", ("k", 4), None, "", 0, False, ()]


def f_add(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def f_mix(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2 - x


def f_two(x: torch.Tensor) -> torch.Tensor:
    return (x * x).cos() + 3


FUNCTIONS = [f_add, f_mix, f_two]

# Backends come in pairs of one kind, often with equal scales: lookalikes are
# where a false hit hides.
kinds = st.sampled_from(KINDS) | st.sampled_from(KEYS).map(lambda key: functools.partial(keyed, key=key))
pairs = st.tuples(kinds, kinds, st.integers(2, 5), st.integers(2, 5)).map(
    lambda t: [t[0](t[2]), (t[0] if t[0] in KINDS else t[1])(t[3])])
backend_lists = st.lists(pairs, min_size=1, max_size=3).map(lambda ps: [b for pair in ps for b in pair])


@dataclass
class Tally:
    calls: int = 0
    wrong: list = field(default_factory=list)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The false hits found by hand: lookalikes that upstream's `==` lets share.
@example(backends=[loose_eq(2), loose_eq(3)], steps=[(0, f_add), (1, f_add), (0, f_add)])
@example(backends=[loose_eq_no_hash(2), loose_eq_no_hash(3)], steps=[(0, f_mix), (1, f_mix)])
@example(backends=[factory_class(2), factory_class(3), stateful(2), stateful(2)],
         steps=[(0, f_two), (1, f_two), (2, f_two), (3, f_two)])
@given(backends=backend_lists,
       steps=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(FUNCTIONS)), min_size=2, max_size=10))
def test_no_backend_is_served_another_backends_code(backends, steps):
    torch._dynamo.reset()
    tally = Tally()
    compiled_for: set[tuple] = set()  # (stateful backend's token, function) it compiled
    with torch._dynamo.config.patch(stable_guards=True, recompile_limit=64):
        for b, fn in steps:
            backend, token, scale, kwargs = backends[b % len(backends)]
            x = torch.randn(4)
            RAN.clear()
            COMPILED.clear()
            with torch.no_grad():
                out = torch.compile(fn, backend=backend, **kwargs)(x)
            tally.calls += 1
            compiled_for.update((t, fn) for t in COMPILED)
            if RAN != [token] or not torch.allclose(out, fn(x) * scale):
                tally.wrong.append((fn.__name__, token, RAN[:]))
            if isinstance(backend, Stateful):
                assert (token, fn) in compiled_for  # it (or one with its key) compiled this itself
    torch._dynamo.reset()
    assert tally.wrong == []


def test_a_stateful_backend_compiles_every_function_it_is_used_on():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(stable_guards=True):
        first, second = Stateful(2), Stateful(2)
        for backend in (first, second, first):
            for fn in FUNCTIONS:
                torch.compile(fn, backend=backend)(torch.randn(3))
    torch._dynamo.reset()
    assert len(first.compiled) == len(second.compiled) == len(FUNCTIONS)
