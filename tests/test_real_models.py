"""Warm start on real models: tiny transformers models (random init, no downloads), inference and
checkpointed training, cold then warm in two fresh processes on one cache dir, every output compared
with eager."""

from __future__ import annotations

from pathlib import Path

import pytest
from _children import child_env, run_child, warm_start_available

CHILD = Path(__file__).resolve().parent / "_real_model_child.py"


def _run(cache: Path, flag: bool, model: str, activation: str, mode: str) -> dict:
    return run_child([CHILD, "1" if flag else "0", model, activation, mode],
                     child_env(cache, PYTHONHASHSEED="random"))


@pytest.fixture(scope="module")
def warm_start():
    pytest.importorskip("transformers")
    if not warm_start_available():
        pytest.skip("warm start needs torch's per-compile package bypass (torch 2.15)")


# Flag off for one model only: it shows a restart traces again without the flag (torch's
# behaviour, the same for both models), on the cache dir the flag-on processes filled.
@pytest.mark.parametrize("model, activation, other, mode, flag_off", [("gpt2", "gelu_new", "relu", "infer", True),
                                                                      ("llama", "silu", "gelu", "train", False),
                                                                      ("t5", "relu", "gelu", "generate", False)])
def test_a_causal_lm_starts_warm_and_a_changed_one_is_compiled_again(warm_start, tmp_path, model, activation,
                                                                      other, mode, flag_off):
    """GPT-2 inference over a growing sequence, Llama training steps with transformers'
    gradient checkpointing, and T5's ``generate`` (its decoder cache deep-copies the config:
    ids as memo keys): the restart traces nothing; a restart whose model differs (another
    activation function) is never served the cold one's code."""
    cold = _run(tmp_path / "on", True, model, activation, mode)
    warm = _run(tmp_path / "on", True, model, activation, mode)
    changed = _run(tmp_path / "on", True, model, other, mode)
    assert cold["ok"] and warm["ok"] and changed["ok"], (cold, warm, changed)
    assert cold["frames"] >= 1 and warm["frames"] == 0, warm["explain"]
    assert changed["frames"] >= 1, changed["explain"]
    if flag_off:
        off = _run(tmp_path / "on", False, model, activation, mode)
        assert off["ok"] and off["frames"] >= 1  # flag off: the restart traces again
