"""Backend fingerprints under the four sharing rules, as plain logic (no Dynamo)."""

from __future__ import annotations

import functools
import gc
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stableguards.fingerprint import Fingerprinter, key_for
from stableguards.identity_table import IdentityTable

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
option_dicts = st.dictionaries(st.text(min_size=1, max_size=12), json_values, max_size=6)


class Wrapper:
    """Stands in for one of torch's own wrappers: __call__ only calls its parts."""

    def __init__(self, compiler=None, options=None):
        self.compiler = compiler
        self.options = options

    def __call__(self, gm, example_inputs):
        return self.compiler(gm, example_inputs)


def registered(gm, example_inputs):
    return gm.forward


def other_registered(gm, example_inputs):
    return gm.forward


REGISTRY = {"registered": registered, "other": other_registered}


def name_of(obj):
    return next((name for name, fn in REGISTRY.items() if fn is obj), None)


def fingerprinter() -> Fingerprinter:
    return Fingerprinter(name_of, lambda obj: type(obj) is Wrapper)


FP = fingerprinter()


def digest(obj) -> str:
    return FP.fingerprint(obj).digest


def test_registered_backends_match_by_name():
    a = FP.fingerprint(registered)
    assert a.stable and a.components.items == (("backend", "registered"),)
    assert digest(registered) != digest(other_registered)


@given(option_dicts)
def test_equal_wrapper_options_give_equal_fingerprints(options):
    rebuilt = json.loads(json.dumps(options))  # equal, but every object is new
    reordered = dict(reversed(list(rebuilt.items())))
    a, b = FP.fingerprint(Wrapper(registered, options)), FP.fingerprint(Wrapper(registered, reordered))
    assert a.stable and a.digest == b.digest


@given(option_dicts, option_dicts)
def test_different_wrapper_options_give_different_fingerprints(a, b):
    if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):
        return
    fa, fb = FP.fingerprint(Wrapper(registered, a)), FP.fingerprint(Wrapper(registered, b))
    assert fa.digest != fb.digest and fa.differences(fb)


def test_types_are_part_of_the_configuration():
    def with_option(value):
        return digest(Wrapper(registered, {"x": value}))

    assert len({with_option(1), with_option(1.0), with_option(True), with_option("1"), with_option(b"1")}) == 5
    assert digest(Wrapper(registered, [1])) != digest(Wrapper(registered, (1,)))


def test_differences_name_the_component():
    a = FP.fingerprint(Wrapper(registered, {"max_autotune": True, "mode": "x"}))
    b = FP.fingerprint(Wrapper(registered, {"max_autotune": False, "mode": "x"}))
    c = FP.fingerprint(Wrapper(other_registered, {"max_autotune": True, "mode": "x"}))
    assert a.differences(b) == ["options['max_autotune']: True vs False"]
    assert a.differences(c) == ["compiler.backend: registered vs other"]
    assert "options['max_autotune']=True" in a.description


def make_closure(scale):
    def backend(gm, example_inputs):
        return lambda *a: [o * scale for o in gm.forward(*a)]

    return backend


def make_class(scale):
    class Factory:
        def __call__(self, gm, example_inputs):
            return lambda *a: [o * scale for o in gm.forward(*a)]

    return Factory()


class LooseEq:
    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return isinstance(other, LooseEq)

    def __hash__(self):
        return 0


class Refuses:
    """Any use of its own equality or hash is a bug in the caller."""

    def __eq__(self, other):
        raise AssertionError("__eq__ called")

    def __hash__(self):
        raise AssertionError("__hash__ called")


@pytest.mark.parametrize("make", [make_closure, make_class, LooseEq,
                                  lambda s: functools.partial(registered, scale=s)])
def test_everything_else_matches_by_identity_only(make):
    a, b = make(2), make(2)
    fa = FP.fingerprint(a)
    assert not fa.stable
    assert fa.digest == digest(a)  # the same object matches itself
    assert fa.digest != digest(b)  # an equal-looking one does not
    assert digest(Wrapper(a)) != digest(Wrapper(b))  # nor as a wrapper's part
    assert digest(Wrapper(a)) == digest(Wrapper(a))


def test_a_user_object_is_never_asked_for_its_eq_or_hash():
    obj = Refuses()
    assert FP.fingerprint(obj).digest == FP.fingerprint(obj).digest
    assert digest(Wrapper(obj, {"o": obj})) == digest(Wrapper(obj, {"o": obj}))


class Keyed:
    def __init__(self, key):
        self._torchdynamo_cache_key = key

    def __call__(self, gm, example_inputs):
        return gm.forward


class OtherKeyed(Keyed):
    pass


def test_an_explicit_key_shares_within_its_class():
    assert digest(Keyed("v1")) == digest(Keyed("v1"))
    assert FP.fingerprint(Keyed(("v1", 2))).stable
    assert digest(Keyed("v1")) != digest(Keyed("v2"))
    assert digest(Keyed("v1")) != digest(OtherKeyed("v1"))
    assert digest(Keyed(1)) != digest(Keyed("1")) != digest(Keyed(True))


class RaisingKey:
    @property
    def _torchdynamo_cache_key(self):
        raise RuntimeError("no key")


@pytest.mark.parametrize("key", [None, "", 0, False, (), b"", [1], {"a": 1}, 1.5, object(), ("a", [1])])
def test_falsy_unhashable_or_opaque_keys_are_no_opt_in(key):
    a, b = Keyed(key), Keyed(key)
    assert not FP.fingerprint(a).stable
    assert digest(a) != digest(b)


def test_a_key_that_raises_is_no_opt_in():
    assert digest(RaisingKey()) != digest(RaisingKey())


def test_a_wrapper_that_contains_itself_is_described_once():
    w = Wrapper(registered)
    w.options = {"self": w}
    assert digest(w) == digest(w)


def test_identity_tokens_are_never_reused():
    fp = fingerprinter()
    seen = set()
    addresses = set()
    for _ in range(200):
        obj = LooseEq(1)  # freed (by its count: no cycle) at the next iteration: its address comes back
        seen.add(fp.identity(obj))
        addresses.add(id(obj))
        del obj
    assert len(seen) == 200 and len(addresses) < 200


def test_identity_table_forgets_the_dead_and_keeps_what_it_cannot_watch():
    table: IdentityTable[int] = IdentityTable()
    obj = LooseEq(1)
    assert table.get(obj, lambda: 1) == 1 and table.get(obj, lambda: 2) == 1
    del obj
    gc.collect()
    assert len(table) == 0
    table.get(7, lambda: 3)  # an int cannot be weakly referenced: kept
    assert len(table) == 1


def test_keys_are_interned_by_fingerprint():
    a, b = FP.fingerprint(Wrapper(registered, {"m": 1})), FP.fingerprint(Wrapper(registered, {"m": 1}))
    assert key_for(a) is key_for(b)
    assert key_for(a) is not key_for(FP.fingerprint(Wrapper(registered, {"m": 2})))


def test_stable_fingerprints_are_the_same_in_every_process():
    script = (
        "import sys; sys.path.insert(0, 'tests'); from test_backend_fingerprint import *\n"
        "print(digest(Wrapper(registered, {'a': [1, 2.5, None], 'b': {'c': 'd'}, 'k': Keyed('v')})))\n"
    )
    digests = set()
    for seed in ("0", "1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        digests.add(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                   text=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__))
                                   ).stdout.strip())
    assert len(digests) == 1


def test_addresses_in_labels_are_not_configuration():
    a, b = Wrapper(registered, {"name": str(object())}), Wrapper(registered, {"name": str(object())})
    assert digest(a) == digest(b)
