"""An optimizer's step graph (its parameters and state are graph attributes, checked by id)
starts warm, given the tensors of the warm process, and never where they differ.

Each warm process starts from a copy of its cold process's cache dir
(tests/_graph_params_child.py says what each scenario is).  Checked: every loss
and the final parameters equal eager; an unchanged step traces nothing warm,
the optimizer's step included; a parameter of another shape, two parameters
that now share a storage, fresh or differently laid out optimizer state make
the step graph compile again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _children import child_env, requires_warm_start, run_child

CHILD = Path(__file__).resolve().parent / "_graph_params_child.py"


def _run(cache: Path, scenario: str) -> dict:
    result = run_child([CHILD, scenario], child_env(cache), cwd=CHILD.parent)
    assert result["equal"], (scenario, result["explain"])
    return result


@requires_warm_start
@pytest.mark.parametrize(("cold", "warm_scenarios"), [
    ("plain", ("plain", "aliased", "reshaped")),
    ("adam", ("adam", "adam_fresh", "adam_strided_state")),
])
def test_an_optimizer_step_graph_starts_warm_only_for_the_tensors_it_was_compiled_for(cold, warm_scenarios, tmp_path):
    _run(tmp_path / "cold", cold)
    for scenario in warm_scenarios:
        warm = _run(shutil.copytree(tmp_path / "cold", tmp_path / scenario), scenario)
        if scenario == cold:
            assert warm["traced"] == [], warm["explain"]  # the optimizer's step graph too
        else:
            assert "step" in warm["traced"], warm["explain"]  # its step graph compiled again
        if scenario == "aliased":  # only the storage they share differs: named in the proof
            assert "GRAPH_TENSORS" in warm["explain"], warm["explain"]
