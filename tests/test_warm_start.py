"""Warm start: a restarted process installs the cold run's entries, and never a wrong one.

The entry key (stableguards.warm_start) is plain logic, tested here directly.
The campaign runs a cold and a warm process (inductor on CPU) over case
modules written for each: every case twice, once unchanged between the runs
and once changed in one way that must not be served the cold entry (a global,
a closure value, a default argument, the body, a local helper's body or
which local helper a closure holds, an isinstance check's class,
the backend (from disk, and
in the same process after a load), an inductor
option, the same qualname in another module, another model through
``model.compile()``, a swapped submodule, a swapped global function).  Values
are drawn from a seeded random source; STABLEGUARDS_WARM_CAMPAIGN_SEEDS=N runs
N seeds (CI: 1).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _children import child_env, last_json, requires_warm_start, run_child

from stableguards.codes import code_digest
from stableguards.components import Components, stable_repr
from stableguards.warm_start.key import config_digest, entry_key

CHILD = Path(__file__).resolve().parent / "_warm_start_child.py"


# --- the key ------------------------------------------------------------------------

def _f(x):
    return x + 1


def _g(x):
    return x + 2


class _Holder:
    def method(self, x):
        return x


def test_key_names_what_torch_leaves_out_and_a_miss_names_the_component():
    base = dict(torch_key="t", fn=_f, backend="inductor #1", options={"dynamic": None},
                configs={"inductor": {"a": 1}})
    key = entry_key(**base)
    names = [name for name, _ in key.items]
    assert names[:7] == ["torch_key", "module", "qualname", "file", "code", "receiver", "backend"]
    assert key == entry_key(**base) and key.digest == entry_key(**base).digest
    other = entry_key(**{**base, "backend": "inductor #2", "configs": {"inductor": {"a": 2}}})
    assert [d.split(":")[0] for d in key.differences(other)] == ["backend", "config.inductor"]
    assert entry_key(**{**base, "fn": _g}).digest != key.digest  # another body, another key
    assert Components.from_json(json.loads(json.dumps(key.as_json()))) == key


def test_a_file_named_relative_to_the_working_directory_is_keyed_by_its_absolute_path(monkeypatch, tmp_path):
    """``python train.py`` and ``python /abs/train.py`` (a launcher's restart) run one file."""
    from stableguards.warm_start.key import source_file

    monkeypatch.chdir(tmp_path)
    assert source_file("train.py") == source_file(str(tmp_path / "train.py")) == str(tmp_path / "train.py")
    assert source_file("sub/../train.py") == str(tmp_path / "train.py")
    assert source_file("<string>") == "<string>"  # exec'd code: no file, wherever it ran
    assert source_file("other.py") != source_file("train.py")


def test_a_shared_method_is_keyed_by_its_receivers_class():
    class Other(_Holder):
        pass

    a = entry_key(torch_key="t", fn=_Holder().method, backend="b", options={}, configs={})
    b = entry_key(torch_key="t", fn=Other().method, backend="b", options={}, configs={})
    assert [d.split(":")[0] for d in a.differences(b)] == ["receiver"]


def test_code_digest_and_config_repr_are_the_same_in_every_process():
    """marshal.dumps is not (reference flags), nor a set's order under hash randomization."""
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from stableguards.codes import code_digest
        from stableguards.components import stable_repr
        def f(x, k=3):
            return [y * k for y in x if y > {"a", "b"}.__len__()]
        print(code_digest(f.__code__), stable_repr({"s": {"x", "y", "z"}, "l": [1, 2.5]}))
    """ % str(Path(__file__).resolve().parent.parent))
    outputs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(outputs) == 1 and outputs != {""}


def test_code_digest_sees_nested_code_and_constants():
    def a(x):
        return (lambda y: y + 1)(x)

    def b(x):
        return (lambda y: y + 2)(x)

    assert code_digest(a.__code__) != code_digest(b.__code__)
    assert stable_repr(frozenset({3, 1, 2})) == "frozenset(['1', '2', '3'])"


def test_a_restart_from_another_directory_or_machine_keeps_the_config_key():
    """Dynamo's debug directory follows the working directory and inductor's compile
    threads the core count: neither changes what is compiled, so neither is keyed.
    Every other setting is."""
    base = {"debug_dir_root": "/a/torch_compile_debug", "compile_threads": 2, "trace.enabled": False,
            "xpu.cutlass_dir": "/a", "epilogue_fusion": True}
    moved = {**base, "debug_dir_root": "/b/torch_compile_debug", "compile_threads": 32, "xpu.cutlass_dir": "/b"}
    assert config_digest(base) == config_digest(moved)
    assert config_digest(base) != config_digest({**base, "epilogue_fusion": False})


class _Outer:
    def method(self):
        def inner(x):
            return (lambda y: y * 2)(x)
        return inner


def _make_pair(k):
    def helper(x):
        return x + k
    return helper


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


@_decorated
@_decorated
def _twice_wrapped(x):
    return x * 3


def test_a_functions_code_is_found_again_by_its_path():
    """Every function one ``def`` makes shares its code object: found by path (its name, the
    decorators that wrap it, the enclosing function's constants), it is that object."""
    from stableguards.codes import code_at, code_path

    inner = _Outer().method()
    lam = next(c for c in inner.__code__.co_consts if isinstance(c, type(inner.__code__)))
    undecorated = _twice_wrapped.__wrapped__.__wrapped__
    for code in (_make_pair(1).__code__, inner.__code__, lam, _f.__code__, undecorated.__code__):
        path = code_path(code)
        assert path is not None and code_at(*path) is code
    assert code_path(undecorated.__code__)[2] == 2  # two decorators deep
    assert _make_pair(1).__code__ is _make_pair(2).__code__
    module, outer, wrappers, indices, digest = code_path(_make_pair(1).__code__)
    with pytest.raises(RuntimeError, match="changed"):
        code_at(module, outer, wrappers, indices, "0" * 64)  # the code there is not the saved one
    with pytest.raises(RuntimeError, match="not where it was"):
        code_at(module, "_no_such_function", wrappers, indices, digest)


_doubled = lambda t: t * 2  # noqa: E731 - a module-level lambda is the case
_tripled = lambda t: t * 3  # noqa: E731


class _WithLambda:
    scaled = lambda self, t: t * 4  # noqa: E731


def test_a_lambdas_code_is_found_by_the_name_that_holds_it():
    """A lambda's qualname (``<lambda>``) names no attribute: its code is found by the global
    or class attribute that holds it, and the same qualname in two globals finds each its own."""
    from stableguards.codes import code_at, code_path

    for fn in (_doubled, _tripled, _WithLambda.scaled):
        path = code_path(fn.__code__)
        assert path is not None and code_at(*path) is fn.__code__
    assert code_path(_tripled.__code__)[1] == "_tripled" and code_path(_WithLambda.scaled.__code__)[1] == \
        "_WithLambda.scaled"
    module, _, wrappers, indices, digest = code_path(_doubled.__code__)
    with pytest.raises(RuntimeError, match="changed"):  # that name holds other code now
        code_at(module, "_tripled", wrappers, indices, digest)


class _Held:
    @property
    def scale(self):
        return 2.0

    @scale.setter
    def scale(self, value):
        pass

    @functools.cached_property
    def cached(self):
        return 3.0


def test_a_property_getters_code_is_found_through_its_property():
    """torch's package cannot name a getter's code (``_Held.scale`` is the property); the path
    through the property is what its lookup follows in a restarted process."""
    from stableguards.codes import descriptor_source

    scale, cached = vars(_Held)["scale"], vars(_Held)["cached"]
    assert descriptor_source(scale.fget.__code__) == ("_Held.scale", "fget.__code__")
    assert descriptor_source(scale.fset.__code__) == ("_Held.scale", "fset.__code__")
    assert descriptor_source(cached.func.__code__) == ("_Held.cached", "func.__code__")
    assert descriptor_source(test_a_property_getters_code_is_found_through_its_property.__code__) is None


def test_code_made_outside_its_def_has_no_path():
    """exec'd or replace()'d code is not the constant its path leads to."""
    from stableguards.codes import code_path

    replaced = _make_pair(1).__code__.replace(co_name="helper")
    assert code_path(replaced) is None
    scope: dict = {}
    exec("def outer():\n    def inner():\n        return 1\n    return inner\n", scope)
    assert code_path(scope["outer"]().__code__) is None


@dataclasses.dataclass
class _Record:
    a: int = 1


@dataclasses.dataclass
class _Renamed:
    a: int = 1


_generated_init = _Renamed.__init__
_Renamed.__init__ = functools.wraps(_generated_init)(lambda self, *args, **kwargs: _generated_init(self, *args))


def test_exec_made_code_is_found_through_the_functions_that_run_it():
    """A dataclass's ``__init__`` is made by ``exec`` (no file, no module): found through the
    function that runs it, by that function's module and qualname, also under a decorator
    put on the class afterwards (transformers wraps every output class's ``__init__``)."""
    from stableguards.codes import code_at, code_path

    for code, wrappers in ((_Record.__init__.__code__, 0), (_generated_init.__code__, 1)):
        assert code.co_filename.startswith("<")
        path = code_path(code)
        assert path is not None and path[2] == wrappers and code_at(*path) is code


# --- the campaign ---------------------------------------------------------------------

# model.compile() compiles Module._call_impl, one code object for every model: torch installs
# saved entries for one package per code object, so only the first such model of a process
# starts warm.  torch.compile(model) compiles the class's own forward.
METHOD = '{"method": True}'
MODULES = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "sigmoid": "Sigmoid"}


def _case_sources(rng: random.Random) -> dict[str, tuple[str, str]]:
    """Case name -> (cold source, changed source).  Each module defines build()."""
    a, b = rng.sample([1.5, 2.0, 2.5, 3.0, 4.0], 2)
    k1, k2 = rng.sample(range(2, 9), 2)
    op1, op2 = rng.sample(["sin", "cos", "tanh", "exp"], 2)
    act1, act2 = rng.sample(["relu", "gelu", "silu", "sigmoid"], 2)
    fusion = rng.choice([True, False])
    cfg1, cfg2 = rng.sample(["A", "B"], 2)
    fn_case = "def build():\n    return fn, {how}\n"

    def function(body: str, how: str = "{}") -> str:
        return "import torch\nimport torch.nn.functional as F\n" + body + fn_case.format(how=how)

    local = ("def make():\n    def a(t):\n        return t.{op}() * 2\n    def b(t):\n        return t.{op}() * 3\n"
             "    helper = {pick}\n    def fn(x):\n        return helper(x) + 1\n    return fn\nfn = make()\n")
    getter = ("class Holder:\n    @property\n    def scale(self):\n        torch._dynamo.graph_break()\n"
              "        return torch.ones(8).cos() * {k}\nHOLDER = Holder()\n"
              "def fn(x):\n    return x * HOLDER.scale\n")
    model = textwrap.dedent("""\
        import torch

        class {cls}(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.act = torch.nn.{act}()

            def forward(self, x):
                return self.act(x) * {k}

        def build():
            return {cls}(), {how}
        """)
    return {
        "global_value": (function(f"SCALE = {a}\ndef fn(x):\n    return x.sin() * SCALE\n"),
                         function(f"SCALE = {b}\ndef fn(x):\n    return x.sin() * SCALE\n")),
        "closure_value": (function(f"def make(k):\n    def fn(x):\n        return x.cos() + k\n    return fn\n"
                                   f"fn = make({k1})\n"),
                          function(f"def make(k):\n    def fn(x):\n        return x.cos() + k\n    return fn\n"
                                   f"fn = make({k2})\n")),
        "default_arg": (function(f"def fn(x, k={k1}):\n    return x * k + 1\n"),
                        function(f"def fn(x, k={k2}):\n    return x * k + 1\n")),
        "body": (function(f"def fn(x):\n    return x.{op1}() + 1\n"),
                 function(f"def fn(x):\n    return x.{op2}() + 1\n")),
        "global_function": (function(f"ACT = F.{act1}\ndef fn(x):\n    return ACT(x) * 2\n"),
                            function(f"ACT = F.{act2}\ndef fn(x):\n    return ACT(x) * 2\n")),
        "class_check": (function(f"class A:\n    pass\nclass B:\n    pass\nCFG = {cfg1}()\n"
                                 "def fn(x):\n    return x + 1 if isinstance(CFG, A) else x - 1\n"),
                        function(f"class A:\n    pass\nclass B:\n    pass\nCFG = {cfg2}()\n"
                                 "def fn(x):\n    return x + 1 if isinstance(CFG, A) else x - 1\n")),
        # A local helper (its code is a constant of make's): its body changes, or which
        # local def the closure holds.
        "local_helper": (function(local.format(op=op1, pick="a")), function(local.format(op=op2, pick="a"))),
        "local_choice": (function(local.format(op=op1, pick="a")), function(local.format(op=op1, pick="b"))),
        "backend": (function("def fn(x):\n    return x.sin() * 3\n"),
                    function("def fn(x):\n    return x.sin() * 3\n", '{"backend": "counting"}')),
        # Loaded in the warm process, then compiled there once more under another backend.
        "backend_in_process": (function("def fn(x):\n    return x.cos() * 5\n", '{"then_counting": True}'),
                               function("def fn(x):\n    return x.cos() * 5\n", '{"then_counting": True}')),
        "inductor_option": (function("def fn(x):\n    return x.sin().relu() * 3\n",
                                     f'{{"options": {{"epilogue_fusion": {fusion}}}}}'),
                            function("def fn(x):\n    return x.sin().relu() * 3\n",
                                     f'{{"options": {{"epilogue_fusion": {not fusion}}}}}')),
        # Same qualname and line in another module: the cold run compiles one, the warm the other.
        "qualname_a": (function(f"def fn(x):\n    return x * {k1}\n"), function(f"def fn(x):\n    return x * {k1}\n")),
        "qualname_b": (function(f"def fn(x):\n    return x * {k2}\n"), function(f"def fn(x):\n    return x * {k2}\n")),
        # The compiled code builds an OrderedDict again after the graph: torch loads the collections
        # module through a global named after its id in this process, which a restart lacks.
        "module_object": (function(f"from collections import OrderedDict\ndef fn(x):\n"
                                   f"    return OrderedDict(a=x.sin() * {k1})\n"),
                          function(f"from collections import OrderedDict\ndef fn(x):\n"
                                   f"    return OrderedDict(a=x.sin() * {k2})\n")),
        # random.random() in the graph: torch replays it through a function it installs per process.
        "random_call": (function(f"import random\ndef fn(x):\n    return x + random.random() * {a}\n"),
                        function(f"import random\ndef fn(x):\n    return x + random.random() * {b}\n")),
        # functools.wraps across modules: fn names torch's module and runs in its own (torch would
        # install its compiled graph in torch's globals).
        "wraps_elsewhere": (function(f"import functools\n@functools.wraps(torch.sin)\ndef fn(x):\n"
                                     f"    return x.sin() * {k1}\n"),
                            function(f"import functools\n@functools.wraps(torch.sin)\ndef fn(x):\n"
                                     f"    return x.sin() * {k2}\n")),
        # sum() over tensors: Dynamo inlines its polyfill, which runs a copy of operator.py that
        # sys.modules does not hold (found where the guards check it, its id bound on first call).
        "builtin_sum": (function(f"def fn(x):\n    return sum(t * {k1} for t in (x, x.sin()))\n"),
                        function(f"def fn(x):\n    return sum(t * {k2} for t in (x, x.sin()))\n")),
        # A property's getter compiled as a frame of its own (after a graph break): torch's package
        # cannot name a getter's code; warm start finds it through the property.
        "property_getter": (function(getter.format(k=k1)), function(getter.format(k=k2))),
        "model_class": (model.format(cls="ModelA", act="ReLU", k=k1, how=METHOD),
                        model.format(cls="ModelB", act="ReLU", k=k2, how=METHOD)),
        "model_attribute": (model.format(cls="Model", act=MODULES[act1], k=k1, how="{}"),
                            model.format(cls="Model", act=MODULES[act2], k=k1, how="{}")),
    }


def _write(src: Path, sources: dict[str, str]) -> None:
    src.mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        (src / f"{name}.py").write_text(text)


def _run(src: Path, cache: Path, names: list[str]) -> dict:
    return run_child([CHILD, src, *names], child_env(cache, PYTHONHASHSEED="random"))


SEEDS = range(int(os.environ.get("STABLEGUARDS_WARM_CAMPAIGN_SEEDS", "1")))


@requires_warm_start
@pytest.mark.parametrize("seed", SEEDS)
def test_warm_process_is_never_served_an_entry_that_does_not_match(tmp_path, seed):
    cases = _case_sources(random.Random(seed))
    # Every case twice: "_same" keeps the cold source, "_changed" takes the other one.
    cold = {f"{n}_{v}": c for n, (c, _) in cases.items() for v in ("same", "changed")}
    warm = {f"{n}_same": c for n, (c, _) in cases.items()} | {f"{n}_changed": w for n, (_, w) in cases.items()}
    cold_names = [n for n in cold if not n.startswith("qualname_b")]
    warm_names = [n for n in warm if not n.startswith("qualname_a")]
    _write(tmp_path / "src", {n: cold[n] for n in cold_names})
    first = _run(tmp_path / "src", tmp_path / "cache", cold_names)
    _write(tmp_path / "src", {n: warm[n] for n in warm_names})
    second = _run(tmp_path / "src", tmp_path / "cache", warm_names)
    report = json.dumps(second["cases"], indent=1) + "\n" + second["explain"]

    assert all(c["matches"] for c in first["cases"].values()), first
    assert all(c["matches"] for c in second["cases"].values()), report
    # The counting backend was called: no inductor entry served it, from disk or installed.
    assert second["cases"]["backend_changed"]["counting_calls"] >= 1, report
    assert second["cases"]["backend_in_process_same"]["counting_calls"] >= 1, report
    # Another inductor option, another module of the same qualname, another model class:
    # traced, not installed.
    for name in ("inductor_option_changed", "qualname_b_changed", "model_class_changed", "body_changed",
                 "local_helper_changed", "local_choice_changed", "property_getter_changed", "builtin_sum_changed"):
        assert second["cases"][name]["frames"] >= 1, (name, report)
    # Unchanged cases whose guards can all be saved start warm: nothing traced.
    for name in ("global_value_same", "closure_value_same", "default_arg_same", "body_same",
                 "global_function_same", "class_check_same", "backend_same", "inductor_option_same", "model_class_same",
                 "model_attribute_same", "local_helper_same", "local_choice_same", "module_object_same",
                 "wraps_elsewhere_same", "property_getter_same", "builtin_sum_same"):
        assert second["cases"][name]["frames"] == 0, (name, report)


# --- falling back ---------------------------------------------------------------------

def _restart_in_process() -> None:
    """What a new process would see: Dynamo's caches empty, nothing saved by this process."""
    import torch._dynamo

    from stableguards.warm_start.state import STATE

    torch._dynamo.reset()
    STATE.reset()


@requires_warm_start
def test_a_corrupt_or_failing_entry_compiles_as_usual(tmp_path, monkeypatch, caplog):
    """A truncated entry file, then an install that raises: each time the function compiles
    in the same process, equals eager, and the user's call never fails."""
    import logging

    import torch
    import torch._C._dynamo.eval_frame
    import torch._dynamo.utils as dynamo_utils

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def f(x):
        return x.sin() * 3 - 1

    x = torch.randn(8)
    with torch._dynamo.config.patch(stable_guards=True):
        _restart_in_process()
        torch.testing.assert_close(torch.compile(f)(x), f(x))  # cold: saved
        # The entry (the miss index's record of its key beside it is a few hundred bytes).
        entry = max((tmp_path / "stableguards" / "store" / "blobs").glob("*"), key=lambda p: p.stat().st_size)
        entry.write_bytes(entry.read_bytes()[:64])
        _restart_in_process()
        frames = dynamo_utils.counters["frames"]["total"]
        torch.testing.assert_close(torch.compile(f)(x), f(x))
        assert dynamo_utils.counters["frames"]["total"] == frames + 1  # traced again

        def broken(*args):
            raise KeyError("injected: the entry cannot be attached to its code")

        _restart_in_process()
        torch.testing.assert_close(torch.compile(f)(x), f(x))  # loads what the compile above saved
        _restart_in_process()
        monkeypatch.setattr(torch._C._dynamo.eval_frame, "_load_precompile_entry", broken)
        frames = dynamo_utils.counters["frames"]["total"]
        with caplog.at_level(logging.WARNING):
            torch.testing.assert_close(torch.compile(f)(x), f(x))
        assert dynamo_utils.counters["frames"]["total"] == frames + 1
        _restart_in_process()
    assert any("could not be installed" in r.getMessage() for r in caplog.records)


@requires_warm_start
def test_an_entry_saved_for_compiled_autograd_serves_torchs_cache_when_its_frame_is_traced(tmp_path, monkeypatch,
                                                                                          caplog):
    """Under compiled autograd a training graph's AOTAutograd entry holds its backward
    uncompiled, and a graph with nothing to compute (a view after a graph break) holds its
    graph module.  A process that traces the frames again (their warm-start entries gone, or
    refused) finds those entries in AOTAutograd's cache: torch loads them as hits, with no
    warning and no compile falling back (it read the uncompiled backward's compile time, None,
    and failed)."""
    import logging

    import torch
    import torch._dynamo.utils as dynamo_utils

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

    def step(x):
        loss = model(x).sum()
        loss.backward()
        return loss.detach()

    def viewed(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.view(-1)

    x = torch.randn(4, 8)
    expected = [step(x), *(p.grad.clone() for p in model.parameters()), viewed(x)]
    with torch._dynamo.config.patch(stable_guards=True, compiled_autograd=True), caplog.at_level(logging.WARNING):
        for _ in range(2):  # cold, then with the warm-start entries gone
            _restart_in_process()
            shutil.rmtree(tmp_path / "stableguards" / "store", ignore_errors=True)
            model.zero_grad(set_to_none=True)
            got = [torch.compile(step)(x), *(p.grad for p in model.parameters()), torch.compile(viewed)(x)]
            torch.testing.assert_close(got, expected)
            leaf = x.clone().requires_grad_()
            torch.compile(viewed)(leaf).sum().backward()
            torch.testing.assert_close(leaf.grad, x.cos())
        _restart_in_process()
    assert dynamo_utils.counters["aot_autograd"]["autograd_cache_hit"] >= 1
    assert not [r.getMessage() for r in caplog.records if "stableguards" in r.getMessage()]


@requires_warm_start
def test_a_kernel_missing_from_the_cache_dir_is_built_again_on_load(tmp_path):
    """A warm load skips inductor's precompiled-header step (the kernels are on disk);
    a kernel deleted from the cache dir is compiled again without one, and is right."""
    source = "import torch\ndef fn(x):\n    return (x.sin() * 3).cumsum(0)\ndef build():\n    return fn, {}\n"
    _write(tmp_path / "src", {"kernel": source})
    cold = _run(tmp_path / "src", tmp_path / "cache", ["kernel"])
    kernels = [p for p in (tmp_path / "cache").rglob("*.so") if "precompiled_headers" not in p.parts]
    assert cold["cases"]["kernel"]["matches"] and kernels
    for kernel in kernels:
        kernel.unlink()
    warm = _run(tmp_path / "src", tmp_path / "cache", ["kernel"])
    assert warm["cases"]["kernel"] == {"matches": True, "frames": 0, "counting_calls": 0}, warm["explain"]
    assert all(kernel.exists() for kernel in kernels)

def _cold_then_warm(script: str, cache: Path) -> list[dict]:
    """``script`` (given the tests' directory) in a cold process, then a warm one on the same
    cache dir: what each printed last, as JSON."""
    return [_run_script(script, cache) for _ in range(2)]


def _run_script(script: str, cache: Path, **extra: str) -> dict:
    """``script`` in a fresh process on ``cache`` (``extra``: more environment)."""
    return run_child(["-c", script, Path(__file__).parent], child_env(cache, **extra))


NOTHING_TO_COMPUTE = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from _traced import TRACED
    torch._dynamo.config.stable_guards = True
    import stableguards

    W = torch.nn.Parameter(torch.ones(8))

    def infer(x):
        y = (x * 2).sum()
        torch._dynamo.graph_break()
        return y.detach()  # a graph whose output is its input: inductor compiles nothing

    def train(x):
        loss = (x * W).sum()
        loss.backward()
        return loss.detach()

    x = torch.arange(8.0)  # exact sums: a random x's sum near 0 fails allclose's default atol in ~0.3% of runs
    ok = all(torch.allclose(torch.compile(fn)(x), fn(x)) for fn in (infer, train) for _ in range(2))
    print(json.dumps({"ok": ok, "traced": [code.co_name for code in TRACED], "explain": stableguards.explain()}))
""")


@requires_warm_start
def test_a_graph_with_nothing_to_compute_starts_warm(tmp_path):
    """``return loss.detach()`` after a graph break: inductor returns the graph module as it
    is, which torch cannot bundle; our entry holds the module itself, and a restart traces
    nothing."""
    cold, warm = _cold_then_warm(NOTHING_TO_COMPUTE, tmp_path)
    assert cold["ok"] and "torch_dynamo_resume_in_infer_at_12" in cold["traced"], cold
    assert warm["ok"] and warm["traced"] == [], warm


# A training step under compiled autograd, and its eager twin, for the child scripts below.
_TRAINING_STEP = textwrap.dedent("""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)

    target = torch.tensor([0, 1, 2, 3])

    def step(m, x):  # cross_entropy: its backward makes tensors from no input (iota, full)
        loss = torch.nn.functional.cross_entropy(m(x), target)
        loss.backward()
        return loss.detach()
""")


COMPILED_AUTOGRAD = textwrap.dedent("""
    import copy, json, os, sys, torch
    torch._dynamo.config.stable_guards = True
    torch._dynamo.config.compiled_autograd = True
    import stableguards
    from torch._dynamo.utils import counters

    sys.path.insert(0, sys.argv[1])
    from _traced import TRACED

""") + _TRAINING_STEP + textwrap.dedent("""

    if os.environ.get("HOOKED"):  # a gradient hook, a closure: compiled autograd's graph calls it
        sys.path.insert(0, os.environ["HOOK_DIR"])
        from _ca_hook import scaled
        for m in (model, twin):
            m[0].weight.register_hook(scaled(float(os.environ["HOOKED"])))
    compiled = torch.compile(step)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    ok = True
    for _ in range(2):
        ok &= torch.allclose(compiled(model, x), step(twin, x))
        ok &= all(torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(model.parameters(), twin.parameters()))
        model.zero_grad(set_to_none=True), twin.zero_grad(set_to_none=True)
    aot, fx = counters["aot_autograd"], counters["inductor"]
    print(json.dumps({"ok": bool(ok), "traced": [code.co_name for code in TRACED], "explain": stableguards.explain(),
                      "aot": [aot["autograd_cache_hit"], aot["autograd_cache_miss"], aot["autograd_cache_bypass"]],
                      "fx": [fx["fxgraph_cache_hit"], fx["fxgraph_cache_miss"]]}))
""")


@requires_warm_start
def test_compiled_autograd_step_starts_warm(tmp_path):
    """Compiled autograd traces a training step's backward itself, so AOTAutograd never compiled
    the backward graph the step's entry needs, and the entry was never saved (it used to wait
    for it forever).  The entry is saved when compiled autograd first traces the backward, with
    the backward module uncompiled: a restart installs it and compiled autograd re-traces the
    saved module.  The cold process's compiled autograd inlines the backward
    module as a restart loads it, so both make one graph, and its entry, saved under a module
    named by that graph's code and globals (``identity.fx_home``), is installed: the restart
    traces nothing.  A restart whose backward differs (a gradient hook compiled autograd's
    graph calls) makes another graph: compiled, never served the cold one's code.  One whose
    hook differs only in what its closure holds makes the same graph, in the same module: its
    entry is installed, and its guards on the hook refuse the call."""
    cold, warm = runs = _cold_then_warm(COMPILED_AUTOGRAD, tmp_path)
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "_ca_hook.py").write_text("def scaled(k):\n    return lambda grad: grad * k\n")
    hooked = _run_script(COMPILED_AUTOGRAD, tmp_path, HOOKED="2", HOOK_DIR=str(tmp_path / "hook"))
    rehooked = _run_script(COMPILED_AUTOGRAD, tmp_path, HOOKED="3", HOOK_DIR=str(tmp_path / "hook"))
    for run in (*runs, hooked, rehooked):
        assert run["ok"] and "fallbacks" not in run["explain"], run["explain"]
    assert "step" in cold["traced"] and "forward" in cold["traced"] and cold["aot"][1] > 0, cold
    assert cold["fx"][1] == 2, cold  # the forward's graph and compiled autograd's: no backward graph compiled
    assert "forward (<eval_with_key>" in cold["explain"] and "left out" not in cold["explain"], cold["explain"]
    assert warm["explain"].count("installed its saved compiled entry") == 2, warm["explain"]
    assert warm["traced"] == [] and warm["fx"] == [0, 0] and warm["aot"] == [0, 0, 0], warm
    assert hooked["traced"] == ["forward"], hooked  # compiled autograd's graph; the step is installed
    assert rehooked["traced"] == ["forward"], rehooked
    assert re.search(r"forward \(<eval_with_key>\.\d+:\d+\) installed", rehooked["explain"]), rehooked["explain"]


FX_GRAPH_MODULE = textwrap.dedent("""
    import json, os, sys, torch, torch.fx
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, os.environ["WRAPPED_DIR"])
    from _traced import TRACED
    torch._dynamo.config.stable_guards = True
    import stableguards
    from _fx_wrapped import scale

    torch.fx.wrap("scale")

    def f(x):
        return scale(x) + 1

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4)
    with torch.no_grad():
        ok = torch.allclose(torch.compile(gm)(x), f(x))
    print(json.dumps({"ok": bool(ok), "traced": [code.co_name for code in TRACED],
                      "explain": stableguards.explain()}))
""")


@requires_warm_start
def test_a_graph_modules_code_is_keyed_by_what_its_globals_are(tmp_path):
    """A graph module torch.fx generated runs in globals of its own; its entry is keyed by its
    code and what every one of them is (``identity.fx_home``): a restart whose graph has the
    same code but calls a function whose body differs finds no entry for it."""
    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    runs = []
    for body in ("x * 2", "x * 2", "x * 3"):
        (wrapped / "_fx_wrapped.py").write_text(f"def scale(x):\n    return {body}\n")
        runs.append(_run_script(FX_GRAPH_MODULE, tmp_path / "cache", WRAPPED_DIR=str(wrapped)))
    cold, warm, changed = runs
    assert all(run["ok"] for run in runs), runs
    assert cold["traced"] == ["forward"] and warm["traced"] == [], warm["explain"]
    assert changed["traced"] == ["forward"], changed["explain"]
    assert "saved entry" not in changed["explain"], changed["explain"]  # none under its key


BACKWARD_IN_OR_OUT = textwrap.dedent("""
    import copy, json, os, sys, torch
    torch._dynamo.config.stable_guards = os.environ.get("FLAG", "1") == "1"
    torch._dynamo.config.compiled_autograd = True
    import stableguards
    import torch._dynamo.compiled_autograd as compiled_autograd
    from torch._dynamo.utils import counters

    sys.path.insert(0, sys.argv[1])
    from _traced import TRACED

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    target = torch.tensor([0, 1, 2, 3])

    def loss_of(m, x):
        return torch.nn.functional.cross_entropy(m(x), target)

    compiled = torch.compile(loss_of)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    ok = True
    for _ in range(2):
        loss, expected = compiled(model, x), loss_of(twin, x)
        if os.environ["UNDER_CA"] == "1":  # compiled autograd traces the backward
            with compiled_autograd._enable(torch.compile):
                loss.backward()
        else:  # called outside the compiled region: compiled autograd does not take it
            loss.backward()
        expected.backward()
        ok &= torch.allclose(loss, expected)
        ok &= all(torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(model.parameters(), twin.parameters()))
        model.zero_grad(set_to_none=True), twin.zero_grad(set_to_none=True)
    print(json.dumps({"ok": bool(ok), "traced": [code.co_name for code in TRACED], "explain": stableguards.explain(),
                      "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
                      "aot_hits": counters["aot_autograd"]["autograd_cache_hit"]}))
""")


@requires_warm_start
def test_a_backward_compiled_autograd_may_take_is_saved_by_whoever_runs_it_first(tmp_path):
    """A graph compiled where compiled autograd is on saves its entry at its backward's first use.
    Traced by compiled autograd, the backward is saved uncompiled: the cold process compiles the
    forward and compiled autograd's graph, not the backward.  A restart that runs that backward
    outside compiled autograd runs it as its graph module, and equals eager.  Run first outside
    compiled autograd, torch compiles the backward, and the entry holds it compiled.  An entry
    whose backward may be uncompiled is keyed apart: a process with the flag off never finds it."""
    traced_cold = _run_script(BACKWARD_IN_OR_OUT, tmp_path / "traced", UNDER_CA="1")
    traced_warm = _run_script(BACKWARD_IN_OR_OUT, tmp_path / "traced", UNDER_CA="0")
    flag_off = _run_script(BACKWARD_IN_OR_OUT, tmp_path / "traced", UNDER_CA="0", FLAG="0")
    run_cold = _run_script(BACKWARD_IN_OR_OUT, tmp_path / "run", UNDER_CA="0")
    run_warm = _run_script(BACKWARD_IN_OR_OUT, tmp_path / "run", UNDER_CA="0")
    assert flag_off["ok"] and flag_off["aot_hits"] == 0, flag_off
    for run in (traced_cold, traced_warm, run_cold, run_warm):
        assert run["ok"] and "fallbacks" not in run["explain"] and "left out" not in run["explain"], run["explain"]
    assert traced_cold["fx_misses"] == 2, traced_cold  # the forward, compiled autograd's graph
    assert run_cold["fx_misses"] == 2, run_cold  # the forward, its backward
    for warm in (traced_warm, run_warm):
        assert warm["traced"] == [] and warm["fx_misses"] == 0, warm
        installed = re.search(r"loss_of \(<string>:\d+\) installed its saved compiled entry", warm["explain"])
        assert installed, warm["explain"]


DROPPED_BEFORE_BACKWARD = textwrap.dedent("""
    import gc, json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from _traced import TRACED
    torch._dynamo.config.stable_guards = True
    import stableguards

    def loss(x):
        return (x.sin() * 2).sum()

    x = torch.randn(8, requires_grad=True)
    torch.compile(loss)(x).backward()  # the compiled function, and its package, gone before the backward
    gc.collect()
    expected, x.grad = x.grad, None
    loss(x).backward()
    print(json.dumps({"ok": bool(torch.allclose(expected, x.grad)), "traced": [c.co_name for c in TRACED],
                      "explain": stableguards.explain()}))
""")


@requires_warm_start
def test_an_entry_waiting_for_its_backward_outlives_its_compiled_function(tmp_path):
    """``torch.compile(fn)(x).backward()``: the compiled function (and its package) is dropped
    before the backward compiles, which is when a training graph's entry can be saved.  The
    entry is saved all the same, and a restart installs it."""
    cold, warm = _cold_then_warm(DROPPED_BEFORE_BACKWARD, tmp_path)
    assert cold["ok"] and cold["traced"] == ["loss"], cold
    assert warm["ok"] and warm["traced"] == [], warm["explain"]


CHUNKED = textwrap.dedent("""
    import json, sys, torch, torch._dynamo
    torch._dynamo.config.stable_guards = True
    import stableguards
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list, _debug_get_precompile_entries
    from torch._dynamo.utils import counters

    def feed_forward(x):  # BERT's chunk_size_feed_forward: S // 4 chunks pin S
        chunks = x.chunk(x.shape[1] // 4, dim=1)
        return torch.cat([c.relu() * 2 for c in chunks], dim=1)

    torch.compiler.set_stance(sys.argv[1])
    compiled = torch.compile(feed_forward)
    xs = {s: torch.randn(2, s, 8) for s in (8, 12, 16)}
    ok = all(torch.allclose(compiled(xs[s]), feed_forward(xs[s])) for s in (8, 12, 16, 12))
    try:
        compiled(torch.randn(2, int(sys.argv[2]), 8))
        new_shape = "compiled"
    except RuntimeError as error:
        new_shape = "refused" if "recompile" in str(error) else repr(error)
    # Which shape each of Dynamo's cache entries serves, front first.
    entries = [[s for s, x in xs.items() if e.guard_manager.check({"x": x})]
               for e in _debug_get_cache_entry_list(feed_forward.__code__)]
    print(json.dumps({"ok": ok, "graphs": counters["stats"]["unique_graphs"], "frames": counters["frames"]["total"],
                      "new_shape": new_shape, "cache": entries,
                      "precompiled": len(_debug_get_precompile_entries(feed_forward.__code__))}))
""")


def _chunked(cache: Path, stance: str = "default", job_id: str | None = None, new_shape: int = 20) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("STABLEGUARDS_DISABLE", "TORCH_COMPILE_JOB_ID")}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), **({"TORCH_COMPILE_JOB_ID": job_id} if job_id else {}))
    proc = subprocess.run([sys.executable, "-c", CHUNKED, stance, str(new_shape)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc.stdout)


@requires_warm_start
def test_a_warm_process_builds_no_graph_the_cold_one_did_not(tmp_path):
    """With a job id torch's profile marks S dynamic from the warm process's first compile,
    which then builds a graph the cold process never built; the saved entries serve every
    call the cold process served instead."""
    cold, warm = (_chunked(tmp_path, job_id="chunked") for _ in range(2))
    assert cold["ok"] and cold["graphs"] == 4  # S = 8, 12 (dynamic), 16, 20
    assert warm["ok"] and warm["graphs"] == 0 and warm["frames"] == 0


@requires_warm_start
def test_loaded_entries_join_dynamos_cache_as_traced_ones_do(tmp_path):
    """A loaded entry becomes one of Dynamo's cache entries on its first call, so the
    entry that served the last call is tried first, as in the cold process; under
    fail_on_recompile from the first call, saved shapes run and a new one is refused."""
    cold = _chunked(tmp_path)
    warm = _chunked(tmp_path, new_shape=24)  # a recompile beside the loaded entries
    strict = _chunked(tmp_path, stance="fail_on_recompile", new_shape=28)  # 24 was saved by warm
    # The last call's entry (S=20 or 24) in front; then the most recently used first, as
    # the cold process has them.
    assert cold["cache"] == warm["cache"] == [[], [12], [16], [8]]
    assert (warm["ok"], warm["frames"], warm["new_shape"], warm["precompiled"]) == (True, 1, "compiled", 0)
    assert (strict["ok"], strict["frames"], strict["new_shape"]) == (True, 0, "refused")


# --- torch's own caches keep their meaning --------------------------------------------

def _hot_load_counts(flag: bool) -> list[tuple]:
    """Compile, save the mega-cache, reset, load it and compile again, then compile new
    shapes: torch's cache counters and whether there is anything new to serialize."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache
    from torch.compiler._cache import CacheArtifactManager

    def f(x, y):
        return x @ y.sin()

    def seen() -> tuple:
        inductor, aot = counters["inductor"], counters["aot_autograd"]
        return (inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"], aot["autograd_cache_hit"],
                aot["autograd_cache_miss"], CacheArtifactManager.need_serialize())

    shapes = [((4, 4), (4, 4)), ((4, 4), (4, 4)), ((4, 8), (8, 4))]
    rows = []
    with torch._dynamo.config.patch(stable_guards=flag):
        torch._dynamo.reset()
        counters.clear()
        CacheArtifactManager.clear()
        compiled = torch.compile(f, dynamic=False)
        for i, (a, b) in enumerate(shapes):
            x, y = torch.randn(a), torch.randn(b)
            with fresh_cache():
                if i == 1:
                    torch.compiler.load_cache_artifacts(saved)
                torch.testing.assert_close(compiled(x, y), f(x, y))
            rows.append(seen())
            if i == 0:
                saved, _ = torch.compiler.save_cache_artifacts()
            torch._dynamo.reset()
    return rows


@requires_warm_start
def test_the_mega_cache_and_torchs_cache_counters_mean_what_they_mean_without_the_flag(tmp_path, monkeypatch):
    """A package compile names its graph with a fresh id that torch puts in the
    AOTAutograd key: with the flag on, a recompile after save/load_cache_artifacts
    missed that cache and left new artifacts to serialize (upstream's
    test_cache_hot_load_repeat).  Entries saved for warm start are not torch's
    mega-cache artifacts, and a hit on a bundled entry counts as the FX-graph hit
    the unbundled entry would have been."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    off = _hot_load_counts(False)
    on = _hot_load_counts(True)
    assert on == off
    assert off[1] == (1, 1, 1, 1, False)  # after the load: both caches hit (counts add up), nothing new


MODULE_FORWARD = textwrap.dedent("""
    import json, os, sys, torch
    sys.path.insert(0, sys.argv[1])
    from _traced import names
    torch._dynamo.config.stable_guards = True
    import stableguards

    class Calls(torch.nn.Module):  # its forward calls its own module: its hooks run inside
        def forward(self, x, depth: int):
            return self(x, depth - 1) if depth else x * 2

    class Plain(torch.nn.Module):  # its hooks run around its forward, never inside it
        def forward(self, x, depth: int):
            return x.sin() + depth

    x = torch.ones(4)
    out = {}
    for cls in (Calls, Plain):
        m = cls()
        if os.environ.get("HOOKED"):
            m.register_forward_hook(lambda mod, args, result: result + 100)
        before = len(names())
        got = torch.compile(m.forward)(x, 1)
        out[cls.__name__] = {"ok": bool(torch.equal(got, m.forward(x, 1))), "traced": len(names()) > before}
    print(json.dumps(out))
""")


@requires_warm_start
def test_a_modules_own_hooks_are_checked_only_where_its_forward_calls_it(tmp_path):
    """A frame that is a module's forward runs none of that module's hooks (they run around
    it): a hook added there does not keep the entry from serving.  Where the forward calls its
    own module, the hook runs inside the compiled code: the entry must not serve."""
    _run_script(MODULE_FORWARD, tmp_path)
    warm = _run_script(MODULE_FORWARD, tmp_path, HOOKED="1")
    assert warm["Calls"] == {"ok": True, "traced": True}, warm
    assert warm["Plain"] == {"ok": True, "traced": False}, warm
