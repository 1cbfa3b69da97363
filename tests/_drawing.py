"""Drawing a campaign's batch: distinct cases from a hypothesis strategy, deterministic for a seed."""

from __future__ import annotations

import dataclasses
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st


def draw(strategy: st.SearchStrategy[Any], size: int, seed: int | None, *, tries: int = 4) -> list[Any]:
    """``size`` distinct cases (frozen dataclasses with a ``name``) drawn from ``strategy`` in
    ``size * tries`` examples; derandomized when ``seed`` is None.  The first draws are the
    simplest: the last ones are kept, named ``case0``, ``case1``, ..."""
    drawn: dict[Any, None] = {}

    @settings(max_examples=size * tries, database=None, deadline=None, phases=[Phase.generate],
              derandomize=seed is None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def collect(case: Any) -> None:
        drawn.setdefault(case)

    if seed is not None:
        collect = hypothesis.seed(seed)(collect)
    collect()
    return [dataclasses.replace(c, name=f"case{i}") for i, c in enumerate(list(drawn)[-size:])]
