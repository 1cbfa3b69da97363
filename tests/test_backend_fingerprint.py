"""Backend fingerprints: equal configurations agree, different ones never do."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stableguards.backend_match import fingerprint, key_for

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
option_dicts = st.dictionaries(st.text(min_size=1, max_size=12), json_values, max_size=6)


class Backend:
    """Stands in for a configurable backend such as torch's compile wrappers."""

    def __init__(self, mode=None, options=None):
        self.mode = mode
        self.options = options

    def __call__(self, gm, example_inputs):
        return gm.forward


def fw_compiler(gm, example_inputs):
    return gm.forward


@given(option_dicts)
def test_equal_configurations_give_equal_fingerprints(options):
    rebuilt = json.loads(json.dumps(options))  # equal, but every object is new
    reordered = dict(reversed(list(rebuilt.items())))
    a, b = fingerprint(Backend("default", options)), fingerprint(Backend("default", reordered))
    assert a.stable and a.digest == b.digest


@given(option_dicts, option_dicts)
def test_different_configurations_give_different_fingerprints(a, b):
    if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):
        return
    assert fingerprint(Backend(options=a)).digest != fingerprint(Backend(options=b)).digest


def test_types_are_part_of_the_configuration():
    assert fingerprint(Backend(options={"x": 1})).digest != fingerprint(Backend(options={"x": 1.0})).digest
    assert fingerprint(Backend(options={"x": 1})).digest != fingerprint(Backend(options={"x": True})).digest
    assert fingerprint(Backend(options=[1])).digest != fingerprint(Backend(options=(1,))).digest


def test_wrapped_compilers_are_compared_by_what_they_are():
    def other_compiler(gm, example_inputs):
        return gm.forward

    assert fingerprint(functools.partial(fw_compiler)).digest == fingerprint(functools.partial(fw_compiler)).digest
    assert fingerprint(Backend(options={"fw": fw_compiler})).digest != \
        fingerprint(Backend(options={"fw": other_compiler})).digest


def make_closure_backend(scale):
    def backend(gm, example_inputs):
        return lambda *a: [o * scale for o in gm.forward(*a)]

    return backend


def test_closures_are_described_by_their_values():
    assert fingerprint(make_closure_backend(2)).digest == fingerprint(make_closure_backend(2)).digest
    assert fingerprint(make_closure_backend(2)).digest != fingerprint(make_closure_backend(3)).digest


class Opaque:
    __slots__ = ("state",)

    def __init__(self):
        self.state = object()

    def __call__(self, gm, example_inputs):
        return gm.forward


def test_what_cannot_be_described_falls_back_to_identity():
    import torch

    tensor_closure = make_closure_backend(torch.ones(2))
    for backend in (Opaque(), tensor_closure, Backend(options={"w": torch.ones(1)})):
        fp = fingerprint(backend)
        assert not fp.stable and fp.reason
        assert fp.digest == fingerprint(backend).digest  # the same object still matches itself
    assert fingerprint(Opaque()).digest != fingerprint(Opaque()).digest


CALLS = []


def reads_mutable_global(gm, example_inputs):
    CALLS.append(1)
    return gm.forward


def test_a_backend_reading_mutable_global_state_is_identity_only():
    assert not fingerprint(reads_mutable_global).stable


def test_named_objects_use_their_names():
    fp = fingerprint(Backend(options={"compiler": fw_compiler}),
                     name_of=lambda o: "my_registered" if o is fw_compiler else None)
    assert "my_registered" in fp.description


def test_keys_are_interned_by_fingerprint():
    a, b = fingerprint(Backend("x")), fingerprint(Backend("x"))
    assert key_for(a) is key_for(b)
    assert key_for(a) is not key_for(fingerprint(Backend("y")))


def test_fingerprints_are_the_same_in_every_process():
    script = (
        "import sys; sys.path.insert(0, 'tests'); from test_backend_fingerprint import *\n"
        "print(fingerprint(Backend('max', {'a': [1, 2.5, None], 'b': {'c': 'd'}, 'fw': fw_compiler})).digest)\n"
    )
    digests = set()
    for seed in ("0", "1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        digests.add(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                   text=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__))
                                   ).stdout.strip())
    assert len(digests) == 1


def test_readable_description_names_options():
    fp = fingerprint(Backend("max-autotune", {"epilogue_fusion": False}))
    assert "max-autotune" in str(fp) and "epilogue_fusion" in str(fp)


@pytest.mark.parametrize("value", [float("inf"), -0.0, 1e300])
def test_odd_floats(value):
    assert fingerprint(Backend(options={"v": value})).digest == fingerprint(Backend(options={"v": value})).digest


def test_addresses_in_names_are_not_configuration():
    a, b = Backend(options={"name": str(object())}), Backend(options={"name": str(object())})
    assert fingerprint(a).digest == fingerprint(b).digest
