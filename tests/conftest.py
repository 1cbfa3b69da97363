from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture
def fresh_dynamo():
    """Dynamo with no cached frames before and after the test."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
