"""reads_identity: a function told by its code and everything it reads (plain Python, no Dynamo)."""

from __future__ import annotations

import sys
import types

import pytest

from stableguards.identity.reads import code_names, reads_identity, versioned


@pytest.fixture
def module():
    """A module in sys.modules whose source the test writes, as a user's file would be."""
    made = []

    def make(name: str, source: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        made.append(name)
        exec(compile(source, f"{name}.py", "exec"), vars(mod))
        return mod

    yield make
    for name in made:
        sys.modules.pop(name, None)


def test_a_global_the_function_reads_is_part_of_it(module):
    mod = module("sg_reads_a", "K = 2\ndef f(t):\n    return t * K\n")
    before = reads_identity(mod.f)
    mod.K = 3
    assert before is not None and reads_identity(mod.f) != before
    mod.K = 2
    assert reads_identity(mod.f) == before


def test_a_value_read_through_another_module_or_a_class_is_part_of_it(module):
    helpers = module("sg_reads_helpers", "K = 2\nclass Config:\n    SCALE = 1.0\n")
    mod = module("sg_reads_b", "import sg_reads_helpers as helpers\n"
                               "def f(t):\n    return t * helpers.K * helpers.Config.SCALE\n")
    before = reads_identity(mod.f)
    helpers.Config.SCALE = 2.0
    assert reads_identity(mod.f) != before
    helpers.Config.SCALE = 1.0
    helpers.K = 5
    assert reads_identity(mod.f) != before


def test_a_function_it_calls_is_described_with_what_that_reads(module):
    mod = module("sg_reads_c", "K = 2\ndef inner(t):\n    return t + K\ndef f(t):\n    return inner(t) * 2\n")
    before = reads_identity(mod.f)
    mod.K = 3
    assert reads_identity(mod.f) != before


def test_closures_defaults_and_recursion(module):
    mod = module("sg_reads_d", "def make(k):\n    def f(t, n=1):\n        return f(t, n - 1) if n else t * k\n"
                               "    return f\n")
    assert reads_identity(mod.make(2)) == reads_identity(mod.make(2)) != reads_identity(mod.make(3))


def test_something_with_no_identity_read_anywhere_leaves_it_undescribed(module):
    mod = module("sg_reads_e", "class Opaque:\n    pass\nSTATE = Opaque()\ndef f(t):\n    return t if STATE else t\n")
    assert reads_identity(mod.f) is None
    assert reads_identity(lambda t: t) is not None  # this test module is in sys.modules
    scope: dict = {"held": type("Opaque", (), {})()}
    exec("def g(t):\n    return t\n", scope)
    assert reads_identity(scope["g"]) is None  # globals that are no module's, holding what has no identity


def test_torch_and_the_standard_library_are_described_by_their_versions(module):
    mod = module("sg_reads_f", "import json\ndef f(x):\n    return json.dumps(x)\n")
    assert reads_identity(mod.f) is not None  # json's own globals are not walked
    assert versioned("torch._functorch") and versioned("json.decoder") and not versioned("sg_reads_f")


def test_code_names_reach_nested_code():
    def outer():
        def inner():
            return FOO.bar  # noqa: F821 - never run
        return inner

    assert {"FOO", "bar"} <= code_names(outer.__code__)
