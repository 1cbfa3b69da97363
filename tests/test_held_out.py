"""Warm start on held-out scenarios (tests/_held_out.py), run only with STABLEGUARDS_HELD_OUT=1.

Each scenario runs in a cold and a warm process on one cache dir, each drawing its own hash
seed, flag on and off; every result is compared with eager in its own process.  Flag on,
nothing may differ from eager; flag off shows which changes torch itself serves stale.
"""

from __future__ import annotations

import os

import pytest
from _children import requires_warm_start
from _held_out import SCENARIOS

from test_warm_campaign import _run

pytestmark = [requires_warm_start,
              pytest.mark.skipif(not os.environ.get("STABLEGUARDS_HELD_OUT"),
                                 reason="held out: run with STABLEGUARDS_HELD_OUT=1 before resolving")]


def _campaign(root, flag: bool) -> tuple[dict, dict]:
    runs = []
    for warm in (False, True):
        (root / "src").mkdir(parents=True, exist_ok=True)
        for s in SCENARIOS:
            (root / "src" / f"{s.name}.py").write_text(s.source(warm))
        runs.append(_run(root / "src", root / "cache", flag, [s.name for s in SCENARIOS]))
    return runs[0], runs[1]


def test_held_out_scenarios_are_never_served_stale(tmp_path_factory):
    on = _campaign(tmp_path_factory.mktemp("on"), flag=True)
    off = _campaign(tmp_path_factory.mktemp("off"), flag=False)
    for s in SCENARIOS:
        print(s.name, " | ".join(str(run["cases"][s.name]) for run in (*on, *off)))
    print(on[1]["explain"])
    assert not [run for run in on if "fallbacks" in run["explain"]]  # no hook failed
    for s in SCENARIOS:
        cold, warm = on[0]["cases"][s.name], on[1]["cases"][s.name]
        assert cold["matches"] and warm["matches"], s.name
        if s.per_process or s.cold != s.warm:
            assert warm["frames"] > 0, s.name  # changed, or per process: never served
