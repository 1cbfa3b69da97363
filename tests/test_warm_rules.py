"""Warm start's plain logic, without Dynamo: identities, the guard-rule table, unguarded
facts and the proof check (stableguards.warm_start)."""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import os
import subprocess
import sys
import textwrap
import types
import weakref
from pathlib import Path

import hypothesis
import pytest
from hypothesis import strategies as st

from stableguards.identity.reads import reads_identity
from stableguards.operators import Opaque, Recorded, registrations
from stableguards.operators import describe as describe_operator
from stableguards.warm_start import facts
from stableguards.warm_start.audit import descriptions, report, trusted
from stableguards.warm_start.guard_rules import (
    LAMBDA_RULES,
    RULES,
    Check,
    Fact,
    Unprovable,
    code_of,
    explain_unproven,
    fact,
    one_object,
    rule_for,
    unproven,
)
from stableguards.identity.covers import covers
from stableguards.identity.names import by_state, graph_tensor
from stableguards.identity.objects import identity, Identities
from stableguards.warm_start.proof import Proof, Recheck, check
from stableguards.warm_start.state import Binding

ROOT = Path(__file__).resolve().parent.parent


# --- identity ---------------------------------------------------------------------------

def _double(t):
    return t * 2


def _triple(t):
    return t * 3


def _with_default(t, k=2):
    return t * k


def _make(k):
    def scaled(t):
        return t * k
    return scaled


class _Base:
    def op(self, t):
        return t + 1


class _Child(_Base):
    SCALE = 2.0

    def forward(self, t):
        return super().op(t) * self.SCALE


class _Color(enum.Enum):
    RED = 1


def test_identity_tells_apart_what_a_compile_can_and_only_that():
    assert identity(_double) == identity(_double)
    assert identity(_double) != identity(_triple)  # another body
    assert identity(_make(2)) == identity(_make(2)) != identity(_make(3))  # closure contents
    copy = types.FunctionType(_with_default.__code__, _with_default.__globals__, "_with_default", (3,))
    copy.__qualname__ = _with_default.__qualname__
    assert identity(copy) != identity(_with_default)  # defaults
    assert identity(_double.__code__) != identity(_triple.__code__)
    assert identity(os) == "module:os"
    assert identity(len) == "builtin:builtins.len"
    assert identity(functools.partial(_double)) != identity(functools.partial(_triple))
    assert identity(_Color.RED).startswith("enum:class:")
    assert identity((1, "a", None, 2.5)) == identity((1, "a", None, 2.5)) != identity((1, "a", None, 2.0))
    assert identity({"b": 1, "a": 2}) == identity({"a": 2, "b": 1})
    assert identity(weakref.ref(_Child)) == f"weakref({identity(_Child)})"  # what it refers to


class _Level(enum.IntEnum):
    K = 2


def test_an_enum_member_is_its_value_and_its_class_is_its_members():
    """Dynamo checks ``Lvl.K`` by id and folds its int: a member's identity names its value,
    the data it mixes in and its attributes, and its class's names every member's value."""
    before, cls_before = identity(_Level.K), identity(_Level)
    try:
        _Level.K._value_ = 3  # as a restarted process whose source says K = 3 has it
        assert identity(_Level.K) != before and identity(_Level) != cls_before
    finally:
        _Level.K._value_ = 2
    assert identity(_Level.K) == before
    class Odd(int, enum.Enum):  # a value that is not the int it holds
        A = 1

        def __new__(cls, value):
            member = int.__new__(cls, value * 10)
            member._value_ = value
            return member

    Odd.__module__, Odd.__qualname__ = __name__, "_Odd"
    globals()["_Odd"] = Odd
    try:
        assert identity(Odd.A).endswith(".A=int:1:int:10")
        Odd.A.extra = types.SimpleNamespace()  # an attribute with no identity: none for the member
        assert identity(Odd.A) is None
    finally:
        del globals()["_Odd"]


class _Cached:
    @functools.cached_property
    def scale(self):
        return 2.0

    twice = functools.partialmethod(lambda self, t, k: t * k, k=2)


def test_a_cached_property_and_a_partialmethod_are_what_they_compute():
    before = identity(_Cached)
    assert before is not None
    original = _Cached.__dict__["scale"].func
    try:
        _Cached.__dict__["scale"].func = _triple  # another function behind the same name
        assert identity(_Cached) != before
    finally:
        _Cached.__dict__["scale"].func = original
    assert identity(_Cached) == before
    assert identity(functools.partialmethod(_double, 2)) != identity(functools.partialmethod(_double, 3))


def test_a_c_function_is_its_import_name_and_its_packages_version(monkeypatch):
    import math

    assert identity(math.sin) == "builtin:math.sin"  # the interpreter's: its version is in the key
    module = types.ModuleType("sg_c_ext")
    monkeypatch.setitem(sys.modules, "sg_c_ext", module)
    from stableguards.identity import names as rules

    rules.package_version.cache_clear()
    assert rules.package_version("sg_c_ext") is None  # no version: no identity
    module.__version__ = "1.2"
    rules.package_version.cache_clear()
    assert rules.package_version("sg_c_ext.sub") == "@1.2"
    rules.package_version.cache_clear()


def test_identity_has_no_answer_where_nothing_names_the_object_elsewhere():
    class Local:
        pass

    assert identity(Local) is None  # a local class: not importable
    assert identity(object()) == "object()"  # a sentinel: nothing but its identity
    assert identity(types.SimpleNamespace()) is None
    assert identity(_make(types.SimpleNamespace())) is None  # a closure over an object with no identity
    exec_globals: dict = {"held": types.SimpleNamespace()}
    exec("def f(t):\n    return t\n", exec_globals)
    assert identity(exec_globals["f"]) is None  # globals that are no module's, holding what has no identity


def test_a_class_is_its_methods_along_its_mro():
    before = identity(_Child)
    original = _Base.op
    try:
        _Base.op = lambda self, t: t - 1  # patched on a base class
        assert identity(_Child) != before
    finally:
        _Base.op = original
    assert identity(_Child) == before and "._Child#" in before


def test_a_function_stableguards_hooked_is_the_function_it_wraps_and_the_hook():
    """A torch class whose method stableguards hooks (``_TorchDynamoContext.__call__``, so every
    ``torch.compiler.disable`` context) keeps an identity: the wrapper's closure holds the hook
    record, described by where it hooks."""
    from stableguards.hooks.core import Hook, _wrap

    def hooked(original):
        return _wrap(Hook("torch._dynamo.eval_frame", "_TorchDynamoContext.__call__", "warm_start",
                          lambda call, *a: call(*a)), original)

    assert identity(hooked(_double)) == identity(hooked(_double)) != identity(hooked(_triple))
    assert identity(hooked(_double)).startswith("hooked:torch._dynamo.eval_frame._TorchDynamoContext.__call__")
    assert identity(hooked(_make(types.SimpleNamespace()))) is None  # what it wraps has none


def test_decorating_context_managers_and_stateless_containers_have_an_identity():
    """What transformers' model classes hold in their methods' closures: torch.no_grad()
    instances, @contextmanager functions used as decorators, torch.fx's immutable_dict."""
    import contextlib

    import torch
    from torch.fx.immutable_collections import immutable_dict

    assert identity(torch.no_grad()) == identity(torch.no_grad()) != identity(torch.enable_grad())
    assert identity(torch.inference_mode(True)) != identity(torch.inference_mode(False))  # its state

    @contextlib.contextmanager
    def scaled(k):
        yield k

    assert identity(scaled(2)) == identity(scaled(2)) != identity(scaled(3))  # the function and its arguments
    assert identity(contextlib.nullcontext()) is None  # not a decorator kind
    assert identity(immutable_dict(a=1)) == identity(immutable_dict(a=1)) != identity(immutable_dict(a=2))
    assert identity(immutable_dict(a=1)) != identity({"a": 1})  # its class's code is part of it


def _halve_grads(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad.mul_(0.5)


def _sgd(shapes=((4, 3), (3,)), optimizer="SGD", **options):
    import torch

    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    return getattr(torch.optim, optimizer)(params, **{"lr": 0.01, **options})


def test_an_optimizer_is_its_class_and_what_it_holds_its_tensors_by_metadata():
    """Dynamo checks an optimizer by id, which another process cannot; what a compile can tell
    of it is its class, its hyperparameters, its hooks and its tensors' metadata (their values
    are data: a compile reads them as guarded inputs)."""
    import torch

    assert by_state(_sgd()) and not by_state(_double) and not by_state(torch.ones(2))
    assert identity(_sgd()) == identity(_sgd()) is not None  # other tensors, other values
    hooked = _sgd()
    hooked.register_step_pre_hook(_halve_grads)
    for changed in (_sgd(lr=0.02), _sgd(momentum=0.9), _sgd(optimizer="Adam"), _sgd(shapes=((3, 4), (3,))),
                    _sgd(shapes=((4, 3),)), hooked):
        assert identity(changed) not in (None, identity(_sgd()))
    again = _sgd()
    again.register_step_pre_hook(_halve_grads)  # another handle id: the same hooks
    assert identity(again) == identity(hooked)
    scheduled = _sgd()
    torch.optim.lr_scheduler.StepLR(scheduled, 1)  # wraps its step, through a weak reference to it
    assert identity(scheduled) not in (None, identity(_sgd()))
    stepped = _sgd(momentum=0.9)
    for p in stepped.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    stepped.step()  # momentum buffers in its state
    assert identity(stepped) not in (None, identity(_sgd(momentum=0.9)))
    # Tensors are described by metadata inside an optimizer only: elsewhere their values may be
    # what a function reads.
    assert identity(torch.ones(2)) is None and identity(_make(torch.ones(2))) is None


def test_an_id_check_bound_on_first_call_checks_that_object_while_it_lives():
    import torch

    binding = Binding()
    first, second = _sgd(), _sgd()
    assert binding.passes(first) and binding.passes(second)  # unbound: its entry has not served yet
    assert binding.bind(first) and not binding.bind(second)
    assert binding.passes(first) and not binding.passes(second)
    del first
    assert not binding.passes(second) and not binding.bind(second)  # the object it checked is gone
    held, other = {"a": 1}, {"a": 1}  # no weak reference (a dict whose id was a memo key): held
    binding = Binding()
    assert binding.bind(held) and binding.passes(held) and not binding.passes(other)
    assert Binding().bind(torch.Size([2]))


def test_which_sources_hold_one_optimizer_is_part_of_their_facts():
    """Two sources that held one optimizer in the cold process must hold one object in the warm
    one too (and two, two): each id check binds on its own, and two equal optimizers have one
    identity."""
    one, other = _sgd(), _sgd()

    def facts(a, b):
        scope = {"L['a']": a, "L['b']": b, "G['f']": _double}
        checks = tuple(Fact(source, "ID_MATCH", f"___check_obj_id({source}, <{identity(obj)}>)")
                       for source, obj in scope.items())
        return one_object(checks, scope.__getitem__, lambda source, obj: by_state(obj))

    shared, apart = facts(one, one), facts(one, other)
    assert shared[0].claim.startswith("(one object at L['a'], L['b']) ___check") and shared[2] == apart[2]
    assert unproven(shared, apart) == list(shared[:2]) and unproven(apart, shared) == list(apart[:2])
    assert unproven(apart, facts(other, one)) == []


def test_hyperparameters_the_tree_checks_are_left_out_of_an_optimizers_identity():
    """A scalar hyperparameter the entry's guards check at its own source is checked on every
    call: an lr schedule at another point still finds the entry.  Anything else still counts."""
    def described(opt, checked=("lr",)):
        return Identities().optimizer(opt, lambda group, key: key in checked)

    def scheduled(lr, **options):  # as an lr scheduler leaves it: its groups' lr changed
        opt = _sgd(**options)
        opt.param_groups[0]["lr"] = lr
        return opt

    assert described(scheduled(0.01)) == described(scheduled(0.5))
    assert described(scheduled(0.01), checked=()) != described(scheduled(0.5), checked=())
    assert described(_sgd(lr=0.01)) != described(_sgd(lr=0.5))  # its defaults: not checked
    assert described(scheduled(0.01, momentum=0.9)) != described(scheduled(0.01, momentum=0.5))
    assert described(_sgd()) != identity(_sgd())


def test_a_function_whose_globals_are_no_modules_is_described_by_what_they_hold():
    """namedtuple's ``__new__`` runs in a namespace made for it; no name finds that namespace
    in another process, so it is described by its contents (the interpreter's builtins by
    name).  A namespace holding something else, or something with no identity, differs."""
    import collections

    def made(default, scope_extra=None):
        pair = collections.namedtuple("Pair", ["lo", "hi"], defaults=[default])
        if scope_extra is not None:
            pair.__new__.__globals__.update(scope_extra)
        return Identities().describe(pair.__new__)

    assert made(3) is not None and made(3) == made(3)
    assert made(3) != made(4)  # its defaults
    assert made(3) != made(3, {"_tuple_new": list.__new__})  # what its namespace holds
    assert made(3, {"opaque": types.SimpleNamespace()}) is None
    ran = {}
    exec("def g(x):\n    return x + 1", ran)  # exec puts the live builtins there
    assert Identities().describe(ran["g"]).startswith("function:namespace#")


def test_a_graphs_tensors_are_what_its_code_sees_and_which_of_them_share_a_storage():
    import torch

    from stableguards.warm_start.facts import graph_tensors

    def fact(first, second):
        return graph_tensors("g", [("a", first), ("b", second)], graph_tensor,
                             lambda t: t.untyped_storage()._cdata)

    base, other = torch.zeros(8), torch.zeros(8)
    apart, views = fact(base[:4], other[4:]), fact(base[:4], base[4:])
    assert apart != views and "shares the storage of a" in views.claim and apart == fact(other[:4], base[4:])
    one = torch.zeros(4)
    assert "is a" in fact(one, one).claim
    assert fact(base[:4], other[4:]) != fact(base[:4], other[:4])  # another offset
    assert graph_tensor(torch.zeros(2, 3)) != graph_tensor(torch.zeros(3, 2).t())  # other strides
    with pytest.raises(Unprovable):
        fact(base, 3.0)


def test_a_version_binding_checks_the_version_of_its_first_call():
    from torch._C._dynamo.guards import dict_version

    from stableguards.warm_start.state import VersionBinding

    state, other = {"step": 1}, {"step": 1}
    binding = VersionBinding(dict_version)
    assert binding.passes(state) and binding.passes(other)  # unbound: its entry has not served yet
    assert binding.bind(state) and binding.passes(state) and not binding.passes(other)
    state["step"] = 2
    assert not binding.passes(state) and not binding.passes([])  # changed; not a dict


def test_a_module_copy_is_a_copy_of_its_module_from_its_file():
    """A module loaded again apart from sys.modules (torch's polyfills' pure-Python operator)
    is described as a copy of that module from that file, and its id check is bound on the
    first call; a module made in memory has no identity."""
    import importlib.util
    import operator
    import types

    from stableguards.identity.names import module_copy

    spec = importlib.util.find_spec("operator")
    py_operator = importlib.util.module_from_spec(spec)  # as torch 2.15's polyfills load it
    spec.loader.exec_module(py_operator)

    assert module_copy(py_operator) and not module_copy(operator)
    assert identity(py_operator) == f"module-copy:operator:{py_operator.__file__}" != identity(operator)
    made = types.ModuleType("operator")
    assert not module_copy(made) and identity(made) is None


def test_a_cycle_names_the_object_instead_of_recursing():
    # A method using super() closes over its class: describing the class meets it again.
    assert identity(_Child) is not None
    ids = Identities()
    assert ids(_Child) == ids(_Child) == identity(_Child)


def _closing_over() -> types.FunctionType:
    held = None

    def method(self):
        return held
    return method


def _cyclic_classes(edges: list[list[int]]) -> list[type]:
    """Classes of a module of their own, class ``i``'s method closing over the classes
    ``edges[i]`` names (itself, or one that closes back: cycles)."""
    module = types.ModuleType("_sg_cyclic")
    sys.modules[module.__name__] = module
    classes = []
    for i in range(len(edges)):
        cls = type(f"C{i}", (), {"method": _closing_over(), "__module__": module.__name__})
        setattr(module, cls.__qualname__, cls)
        classes.append(cls)
    for cls, targets in zip(classes, edges):
        cls.method.__closure__[0].cell_contents = tuple(classes[t] for t in targets)
    return classes


@hypothesis.settings(max_examples=60, deadline=None, database=None)
@hypothesis.given(data=st.data())
def test_what_a_description_remembers_is_what_it_is_asked_anywhere(data):
    """Described one after another (and inside one another) with one Identities, each object of a
    web of classes that close over one another reads as it does described alone."""
    n = data.draw(st.integers(1, 5))
    edges = data.draw(st.lists(st.lists(st.integers(0, n - 1), max_size=3), min_size=n, max_size=n))
    classes = _cyclic_classes(edges)
    try:
        alone = [identity(c) for c in classes]
        shared = Identities()
        order = data.draw(st.permutations(range(n)))
        nested = data.draw(st.lists(st.integers(0, n - 1), max_size=3))
        shared((tuple(classes[i] for i in nested), [c.method for c in classes]))
        assert [shared(classes[i]) for i in order] == [alone[i] for i in order]
        assert [shared(c) for c in classes] == alone
    finally:
        sys.modules.pop("_sg_cyclic", None)


def _fx_scope(source: str, thing: object = None) -> tuple[dict, types.FunctionType]:
    """Globals as torch.fx makes them for a graph module's code (a fresh dict, exec'd into, the
    function taken out of it), and the function."""
    scope = {"__builtins__": __builtins__, "torch_ops_thing": _Child if thing is None else thing}
    exec(compile(source, "<eval_with_key>.7", "exec"), scope)
    return scope, scope.pop("forward")


def test_torch_fx_code_is_homed_by_its_code_and_every_global():
    from stableguards.identity import fx_home
    from stableguards.identity.names import module_of_globals

    def home(scope_and_forward: tuple[dict, types.FunctionType]) -> tuple[str | None, str]:
        scope, forward = scope_and_forward
        return fx_home.home_name(forward.__code__, scope, identity)

    source = "def forward(self, x):\n    return torch_ops_thing(x)\n"
    one, forward = _fx_scope(source)
    name, _ = home((one, forward))
    assert name is not None and name.startswith(fx_home.PREFIX)
    assert home(_fx_scope(source))[0] == name  # the same graph made again, as by another process
    assert home(_fx_scope(source, thing=_Base))[0] != name  # a global differs: another home, another key
    assert home(_fx_scope("def forward(self, x):\n    return torch_ops_thing(x, 2)\n"))[0] != name
    assert home(_fx_scope(source, thing=types.SimpleNamespace())) == (None, "torch_ops_thing")
    assert identity(forward) is None  # globals that are no module's, yet
    graph_class = type("GraphModuleImpl", (), {"forward": forward})
    try:
        assert fx_home.register(one, name, graph_class) == name
        assert module_of_globals(one) == name and vars(sys.modules[name]) is one
        assert fx_home.class_at(name) is graph_class and fx_home.home_of_class(graph_class) == name
        assert identity(forward) is not None  # a function in those globals now has a module
    finally:
        sys.modules.pop(name, None)
        fx_home._CLASSES.pop(name, None)


def test_a_graph_modules_own_class_is_its_methods_and_none_type_its_name():
    torch_fx = pytest.importorskip("torch.fx")
    from stableguards.identity import fx_home

    def f(x):
        return x + 1

    described = []
    for _ in range(2):  # two graph modules of one graph, as two processes make them
        gm = torch_fx.symbolic_trace(f)
        scope = type(gm).forward.__globals__
        assert identity(type(gm)) is None  # not importable, and its code has no module yet
        name, _ = fx_home.home_name(type(gm).forward.__code__, scope, identity)
        try:
            fx_home.register(scope, name, type(gm))
            described.append(identity(type(gm)))
        finally:
            sys.modules.pop(name, None)
            fx_home._CLASSES.pop(name, None)
    assert described[0] is not None and described[0] == described[1]
    assert identity(type(None)) == "class:NoneType"


def test_a_parametrized_modules_class_is_what_it_extends_and_everything_torch_put_in_it():
    """``register_parametrization`` makes a class per module: two modules parametrized alike
    have one identity (as two processes make them); another tensor parametrized, a property
    patched on the class, or another class made at run time, do not."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return w * 2

    def made(name="weight"):
        module = torch.nn.Linear(2, 2)
        parametrize.register_parametrization(module, name, Double())
        return type(module)

    one, two = made(), made()
    assert one is not two and identity(one) is not None and identity(one) == identity(two)
    assert identity(one).startswith("parametrized:class:torch.nn.modules.linear.Linear#")
    assert identity(made("bias")) != identity(one)
    two.extra = property(lambda self: 1)
    assert identity(two) != identity(one)
    assert identity(type("ParametrizedLinear", (torch.nn.Linear,), {})) is None  # made elsewhere
    assert covers(identity(one)).startswith("the class it extends")


def test_a_type_binding_checks_the_class_of_its_first_calls_object():
    from stableguards.warm_start.state import TypeBinding

    class A:
        pass

    class B:
        pass

    binding = TypeBinding()
    assert binding.passes(A()) and binding.passes(B())  # unbound: its entry has not served yet
    assert binding.bind(A()) and binding.passes(A()) and not binding.passes(B()) and not binding.bind(B())


def test_the_interpreters_own_types_are_named_where_types_holds_them():
    """A bound method's type calls itself ``builtins.method``, which ``builtins`` does not hold:
    it is named as ``types`` holds it (Dynamo checks the type of the bound method a
    ``torch.no_grad()`` decorator's wrapper closes over).  Each name imports that type."""
    from stableguards.codes import resolve
    from stableguards.identity.names import TYPES_MODULE_NAMES

    method = types.MethodType(lambda self: self, object())
    assert identity(type(method)) == "class:types.MethodType"
    assert identity(type(len)) == "class:types.BuiltinFunctionType"  # the first of its two names
    for cls, name in TYPES_MODULE_NAMES.items():
        assert resolve(*name.split(".")) is cls and identity(cls) == f"class:{name}"
    assert identity(int).startswith("class:builtins.int#")  # importable by its own name: as before


def test_identities_are_the_same_in_every_process():
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        sys.path.insert(0, %r)
        import test_warm_rules as t
        from stableguards.identity.objects import identity
        print(identity(t._Child), identity(t._make(3)), identity({"s": {"x", "y", "z"}}), identity(t._Color.RED))
    """ % (str(ROOT), str(ROOT / "tests")))
    outputs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(outputs) == 1 and "None" not in outputs.pop()


# --- the guard-rule table -----------------------------------------------------------------

def test_every_rule_says_why_it_is_sound():
    for kind, rule in {**RULES, **LAMBDA_RULES}.items():
        assert rule.why and len(rule.why) > 20, kind
    assert rule_for("SOMETHING_NEW").check is Check.REFUSE
    assert rule_for("LAMBDA_GUARD", "___check_metadata_1234_c0/0").check is Check.REFUSE
    for code in ("__dtensor_spec_1234", "___check_opaque_guard_fn_1234_c0/0"):
        rule = rule_for("LAMBDA_GUARD", code)
        assert rule.check is Check.VALUE and rule.written is not None
    assert rule_for("LAMBDA_GUARD", "torch._functorch.aot_autograd.utils.top_saved_tensors_hooks ids == None"
                    ).check is Check.AMBIENT


def test_a_fact_is_the_guards_code_without_torchs_comments():
    part = "G['__import_helpers'].K == 2                # return x * K  # helpers.py:4 in scale"
    assert fact("G['__import_helpers'].K", "EQUALS_MATCH", [part]) == \
        Fact("G['__import_helpers'].K", "EQUALS_MATCH", "G['__import_helpers'].K == 2")
    assert code_of(["L['d']['a#b'] == 'x#y'   # a comment"]) == "L['d']['a#b'] == 'x#y'"
    # torch's recompile hint is a message, not what is checked
    assert code_of(["___check_type_id(L['m'], 7), type=<class 'M'> (HINT: type M)"]) == \
        "___check_type_id(L['m'], 7), type=<class 'M'>"


@hypothesis.settings(max_examples=400, deadline=None, database=None)
@hypothesis.given(st.text(alphabet="ab #'\"\\", max_size=16))
def test_a_comment_starts_where_pythons_tokenizer_finds_one(line):
    """On every line Python tokenizes, the code ends where its tokenizer finds a comment."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        tokens = []
    hypothesis.assume(tokens and all(t.type != tokenize.ERRORTOKEN for t in tokens))
    comment = next((t.start[1] for t in tokens if t.type == tokenize.COMMENT), None)
    assert code_of([line]) == (line.strip() if comment is None else line[:comment].rstrip())


def test_an_id_becomes_the_identity_of_the_object_it_names():
    code = f"___check_obj_id(G['os'], {id(os)}), type=<class 'module'>  # use"
    written = fact("G['os']", "ID_MATCH", [code], value=lambda: os, identity=identity)
    assert written.claim == "___check_obj_id(G['os'], <module:os>), type=<class 'module'>"
    type_code = f"___check_type_id(L['self'], {id(_Child)})"
    written = fact("L['self']", "TYPE_MATCH", [type_code], value=_Child, identity=identity)
    assert identity(_Child) in written.claim
    with pytest.raises(Unprovable, match="not the id"):  # the code names another object
        fact("G['os']", "ID_MATCH", [f"___check_obj_id(G['os'], {id(sys)})"], value=lambda: os, identity=identity)
    with pytest.raises(Unprovable, match="no identity"):
        thing = types.SimpleNamespace()
        fact("G['x']", "ID_MATCH", [f"___check_obj_id(G['x'], {id(thing)})"], value=lambda: thing,
             identity=identity)


def test_a_script_objects_type_check_becomes_the_identity_of_the_real_objects_type():
    """FAKE_SCRIPT_TYPE_MATCH (a process group a compiled collective reads): the type of the
    object at the source, a fake script object unwrapped to the real one it stands for."""
    class FakeScriptObject:
        def __init__(self, real_obj):
            self.real_obj = real_obj

    code = f"___check_fake_script_type(G['group'].WORLD, {id(_Child)}), type=<class '_Child'>  # use"
    for value in (_Child(), FakeScriptObject(_Child())):
        written = fact("G['group'].WORLD", "FAKE_SCRIPT_TYPE_MATCH", [code], value=lambda v=value: v,
                       identity=identity)
        assert written.claim == f"___check_fake_script_type(G['group'].WORLD, <{identity(_Child)}>), " \
                                "type=<class '_Child'>"
    with pytest.raises(Unprovable, match="not the id"):
        fact("G['group'].WORLD", "FAKE_SCRIPT_TYPE_MATCH", [code], value=object, identity=identity)


def test_an_object_with_no_identity_is_named_on_one_line_with_what_made_the_check():
    """A transformers config's repr is indented JSON: explain() names it on one line, with the
    source line that made Dynamo check it."""
    class Config:
        def __repr__(self):
            return "Config {\n" + "".join(f'  "key{i}": {i},\n' for i in range(40)) + "}"

    config = Config()
    code = f"___check_obj_id(L['self'].config, {id(config)})"
    with pytest.raises(Unprovable) as refused:
        fact("L['self'].config", "ID_MATCH", [code], value=lambda: config, identity=identity)
    message = str(refused.value)
    assert "\n" not in message and 'Config { "key0": 0, "key1": 1,' in message and "..." in message
    assert "Dynamo checks it for" not in message  # no source line given
    # torch appends the user's source line that made the check, and where it is: named too.
    with pytest.raises(Unprovable, match=r"Dynamo checks it for `d = id\(x\) # copy.py:137 in deepcopy`$"):
        fact("L['self'].config", "ID_MATCH", [f"{code}  # d = id(x)  # copy.py:137 in deepcopy"],
             value=lambda: config, identity=identity)


def test_refused_and_ambient_kinds():
    with pytest.raises(Unprovable, match="version counter"):
        fact("G['d']", "DICT_VERSION", ["___dict_version(G['d']) == 12"])
    with pytest.raises(Unprovable, match="state"):
        fact("L", "DEFAULT_DEVICE", ["utils_device.CURRENT_DEVICE == None"])
    written = fact("L", "DEFAULT_DEVICE", ["utils_device.CURRENT_DEVICE == None  # x"],
                   ambient="utils_device.CURRENT_DEVICE == device(type='meta')")
    assert written.claim.endswith("device(type='meta')")


def test_a_warm_tree_may_prove_more_never_less():
    cold = [Fact("L['x']", "TENSOR_MATCH", "a"), Fact("G['K']", "EQUALS_MATCH", "G['K'] == 2")]
    assert unproven(cold, [*cold, Fact("L['y']", "NONE_MATCH", "L['y'] is None")]) == []
    warm = [cold[0], Fact("G['K']", "EQUALS_MATCH", "G['K'] == 3")]
    assert unproven(cold, warm) == [cold[1]]
    assert "G['K'] == 2" in explain_unproven([cold[1]], warm) and "G['K'] == 3" in explain_unproven([cold[1]], warm)
    long_cold = Fact("G['c']", "ID_MATCH", "x" * 200 + "=object()")
    long_warm = Fact("G['c']", "ID_MATCH", "x" * 200 + "=bool:True")
    said = explain_unproven([long_cold], [long_warm])  # where they differ, not their common start
    assert "=object()" in said and "=bool:True" in said


# --- unguarded facts ---------------------------------------------------------------------

class _Module:
    """What facts.module_hooks reads of an nn.Module, and nothing more."""

    def __init__(self) -> None:
        self._forward_pre_hooks: dict = {}
        self._forward_pre_hooks_with_kwargs: dict = {}
        self._forward_hooks: dict = {}
        self._forward_hooks_with_kwargs: dict = {}
        self._forward_hooks_always_called: dict = {}
        self._backward_pre_hooks: dict = {}
        self._backward_hooks: dict = {}
        self._is_full_backward_hook = None


def test_module_hooks_are_a_fact_by_identity_in_order_not_by_handle_id():
    plain, hooked, other = _Module(), _Module(), _Module()
    hooked._forward_hooks[7] = _double
    other._forward_hooks[123] = _double  # another handle id: the same hooks
    assert facts.module_hooks(plain, "L['m']", identity) != facts.module_hooks(hooked, "L['m']", identity)
    assert facts.module_hooks(hooked, "L['m']", identity) == facts.module_hooks(other, "L['m']", identity)
    other._forward_hooks_with_kwargs[123] = True
    assert facts.module_hooks(hooked, "L['m']", identity) != facts.module_hooks(other, "L['m']", identity)
    hooked._forward_pre_hooks[8] = _make(types.SimpleNamespace())
    with pytest.raises(Unprovable, match="no identity"):  # closes over an object with none
        facts.module_hooks(hooked, "L['m']", identity)


def test_a_global_that_shadows_a_builtin_is_a_changed_fact():
    code = compile("def f(t):\n    return len(t) + abs(t[0])\n", "<x>", "exec").co_consts[0]
    names = facts.builtins_read(code, {})
    assert names == {"len", "abs"}
    assert facts.unshadowed_builtins("m", {}, names) != facts.unshadowed_builtins("m", {"len": _double}, names)


def test_a_constant_result_is_a_fact_only_for_values_that_compare_across_processes():
    written = facts.constant_result(_double, (2,), {}, 4, identity)
    assert written.claim.endswith("(2) == 4")
    with pytest.raises(Unprovable):
        facts.constant_result(_double, (types.SimpleNamespace(),), {}, 4, identity)


def test_what_a_folded_value_depends_on_besides_the_program():
    """Numbers hash the same everywhere; strings by the hash seed; objects (and None before
    Python 3.12) by their address; a container by the worst of its items; and a type this
    rule does not know is an address (deny by default)."""
    assert facts.per_process(3) is facts.per_process(2.5) is facts.per_process((1, 2.0, True)) is None
    assert facts.per_process(_Level.K) is None  # an IntEnum member hashes as its int
    assert facts.per_process("a") == facts.per_process(b"a") == facts.per_process(frozenset({1, "a"})) == facts.SEED
    assert facts.per_process(_Color.RED) == facts.SEED  # hash(member) is hash(its name)
    assert facts.per_process(object()) == facts.per_process((1, "a", object())) == facts.ADDRESS
    assert facts.per_process(types.SimpleNamespace()) == facts.ADDRESS
    assert facts.per_process(None) == (None if sys.version_info >= (3, 12) else facts.ADDRESS)


def test_the_hash_seed_is_a_fact_equal_exactly_where_the_seed_is():
    script = ("import sys; sys.path.insert(0, %r); from stableguards.warm_start.facts import hash_seed; "
              "print(hash_seed().claim)" % str(ROOT))
    claims = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "1", "2")]
    assert claims[0] == claims[1] != claims[2]
    assert facts.hash_seed() == facts.hash_seed() and facts.hash_seed().kind == facts.HASH_SEED


def test_the_audit_names_each_identity_an_entry_trusts_and_what_it_covers():
    claim = "___check_obj_id(G['Lvl'], <class:m.Lvl#ab<c>>), type=<class 'm.Lvl'>"
    assert descriptions(claim) == ["class:m.Lvl#ab<c>"]  # the type's repr is not one
    assert descriptions("checks [<class 'm.Mode'>] with list(class:m.Mode#1)", state=True) == ["list(class:m.Mode#1)"]
    proof = Proof((Fact("G['Lvl']", "ID_MATCH", claim), Fact("L['x']", "TENSOR_MATCH", "check_tensor(...)")),
                  (Recheck(facts.hash_seed()),))
    rows = list(trusted(proof))
    assert [(r.kind, r.what) for r in rows] == [("ID_MATCH", "class:m.Lvl#ab<c>"),
                                                ("HASH_SEED", facts.hash_seed().claim)]
    assert "MRO" in rows[0].covers and "hash seed" in rows[1].covers
    assert all(covers(identity(obj)) != covers("nothing:") for obj in (_Level.K, _double, _Child, os, len, (1,)))
    assert "ID_MATCH on G['Lvl']" in report([("m.f", [proof, None])]) and "no proof" in report([("m.f", [None])])


# --- custom operators ---------------------------------------------------------------------

_DUMP = """name: mylib::foo
schema: mylib::foo(Tensor x) -> Tensor
debug: registered at /home/u/mylib.py:3
alias analysis kind: FROM_SCHEMA
CPU: registered at /home/u/mylib.py:3 :: (none) [ boxed ]
Meta: registered at /opt/torch/library.py:1012 :: (none) [ boxed ]
Autograd[alias]: registered at /opt/torch/library.py:1400 :: (none) [ boxed ]
CUDA: registered at /src/ext/foo_kernel.cu:12 :: (Tensor _0) -> Tensor _0 [ boxed unboxed ]
"""


def test_the_dispatchers_kernels_are_read_from_its_dump_with_where_each_came_from():
    found = registrations(_DUMP)
    assert [(r.key, r.from_python) for r in found] == [("CPU", True), ("Meta", True), ("Autograd", True),
                                                      ("CUDA", False)]
    assert found[0].file == "/home/u/mylib.py" and found[0].line == 3


def test_an_operator_is_every_kernel_it_has_and_only_a_complete_account_describes_it():
    """Each Python kernel the dispatcher holds must be one this process saw registered (and
    still the one there), or torch's own proxy for what it keeps; a kernel registered where
    stableguards could not see it leaves the operator without a description."""
    found = registrations(_DUMP)
    seen = {"CPU": Recorded(_double, "/home/u/mylib.py", 3), "Autograd": Recorded(_triple, "/opt/torch/library.py",
                                                                                  1400)}
    kw = dict(torch_dir="/opt/torch/", torch_owned=False, custom_op=False, describe_fn=reads_identity)
    described = describe_operator("mylib::foo", found, seen, {"fake": _with_default}, **kw)
    assert "kernel CPU: function:" in described and "kernel Autograd" in described and "fake: " in described
    assert "CUDA: native /src/ext/foo_kernel.cu:12" in described
    other = describe_operator("mylib::foo", found, {**seen, "CPU": Recorded(_triple, "/home/u/mylib.py", 3)},
                              {"fake": _with_default}, **kw)
    assert other != described  # another CPU kernel
    with pytest.raises(Opaque, match="Meta"):  # a meta kernel from torch's files, and no fake kernel kept
        describe_operator("mylib::foo", found, seen, {}, **kw)
    with pytest.raises(Opaque, match="CPU"):  # replaced since it was recorded (another library made it)
        describe_operator("mylib::foo", found, {**seen, "CPU": Recorded(_double, "/home/u/other.py", 9)},
                          {"fake": _with_default}, **kw)
    with pytest.raises(Opaque, match="CPU"):  # never seen registered
        describe_operator("mylib::foo", found, {"Autograd": seen["Autograd"]}, {"fake": _with_default}, **kw)
    with pytest.raises(Opaque, match="no identity"):  # a kernel over something no other process can name
        describe_operator("mylib::foo", found, seen, {"fake": _make(types.SimpleNamespace())}, **kw)
    # torch's own operator: kernels from torch's files are torch's code; a user's file still needs a record.
    assert describe_operator("aten::x", found[1:], {}, {}, **{**kw, "torch_owned": True})
    with pytest.raises(Opaque):
        describe_operator("aten::x", found, {}, {}, **{**kw, "torch_owned": True})


def test_an_environment_variable_is_a_fact_present_or_absent():
    assert facts.environment("X", {}).claim == "absent"
    assert facts.environment("X", {"X": "1"}) != facts.environment("X", {"X": "2"}) != facts.environment("X", {})


POLICY_FACTOR = 2


def _reads_factor(x):
    return x * POLICY_FACTOR


def test_a_function_run_untraced_is_a_fact_of_what_it_reads(monkeypatch):
    from stableguards.identity.reads import reads_identity

    before = facts.untraced_reads(_reads_factor, "G['policy']", reads_identity)
    assert before == facts.untraced_reads(_reads_factor, "G['policy']", reads_identity)
    monkeypatch.setattr(sys.modules[__name__], "POLICY_FACTOR", 3)  # a global it reads, not its code
    assert facts.untraced_reads(_reads_factor, "G['policy']", reads_identity) != before
    with pytest.raises(Unprovable):
        facts.untraced_reads(lambda x, opaque=types.SimpleNamespace(): x, "G['policy']", reads_identity)


# --- the proof ----------------------------------------------------------------------------

def test_a_proof_round_trips_as_plain_tuples_and_is_checked():
    cold = Proof((Fact("G['K']", "EQUALS_MATCH", "G['K'] == 2"),),
                 (Recheck(Fact("m", facts.UNSHADOWED_BUILTINS, "builtins read: len"), ("len",)),))
    state = cold.to_state()
    assert Proof.from_state(state) == cold
    assert Proof.from_state(("something else",)) is None and Proof.from_state(None) is None
    same = lambda item: item.fact  # noqa: E731
    assert check(cold, cold.facts, same) is None
    assert "G['K'] == 2" in check(cold, [Fact("G['K']", "EQUALS_MATCH", "G['K'] == 3")], same)

    def changed(item):
        return dataclasses.replace(item.fact, claim="builtins read: len; shadowed by globals: len")
    assert "shadowed" in check(cold, cold.facts, changed)

    def cannot(item):
        raise Unprovable("module m is not imported")

    assert "cannot be checked" in check(cold, cold.facts, cannot)


def test_no_aliasing_over_more_tensors_proves_no_aliasing_over_fewer():
    """torch hangs a NO_TENSOR_ALIASING leaf on one of its sources; a rebuilt tree may group the
    tensors otherwise.  A warm guard over a superset proves the cold one; a subset does not."""
    def aliasing(source: str, *args: str) -> Fact:
        return Fact(source, "NO_TENSOR_ALIASING", f"check_no_aliasing({', '.join(args)})")

    cold = [aliasing("L['b']", "L['a']", "L['b']")]
    assert unproven(cold, [aliasing("L['x']", "L['b']", "L['c']", "L['a']")]) == []
    assert unproven(cold, [aliasing("L['b']", "L['a']", "L['c']")]) == cold
    assert unproven(cold, [aliasing("L['b']", "L['a']")]) == cold
    tricky = [aliasing("L['a']", "L['d']['x, y']", "L['e'][f(1, 2)]")]
    assert unproven(tricky, [aliasing("L['a']", "L['e'][f(1, 2)]", "L['d']['x, y']", "L['z']")]) == []
    assert unproven(tricky, [aliasing("L['a']", "L['d']['x", "y']")]) == tricky


class _RewritingRegistry(dict):
    """As transformers' output-capture registry: the key stored is not the key given."""

    def __setitem__(self, key, value):
        super().__setitem__(f"k{key}", value)


class _SlottedDict(dict):
    __slots__ = ("extra",)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)


class _StatefulDict(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value)

    def __setstate__(self, state):
        self.__dict__.update(state)


def test_a_dict_subclass_that_rewrites_its_keys_is_rebuilt_with_the_items_it_holds():
    """Pickle rebuilds a dict subclass through its ``__setitem__``: keys it rewrites are rewritten
    again.  The guard pickler rebuilds one that has no reduce, state or slots of its own from
    the items its storage holds, in their order, with its attributes; other dicts are pickle's."""
    import collections
    import pickle

    from stableguards.warm_start import pickling

    registry = _RewritingRegistry()
    registry[2], registry[1] = "b", "a"
    registry.note = "kept"
    assert dict(pickle.loads(pickle.dumps(registry))) == {"kk2": "b", "kk1": "a"}  # what pickle makes of it
    assert pickling.rebuilt_through_its_setitem(registry)
    rebuilt = pickling.new_object(_RewritingRegistry)
    pickling.set_items_and_attributes(rebuilt, (list(dict.items(registry)), vars(registry)))
    assert type(rebuilt) is _RewritingRegistry and list(rebuilt.items()) == [("k2", "b"), ("k1", "a")]
    assert rebuilt.note == "kept"
    for other in ({"a": 1}, collections.OrderedDict(a=1), collections.defaultdict(int), collections.Counter(a=1),
                  _SlottedDict(a=1), _StatefulDict(a=1)):
        assert not pickling.rebuilt_through_its_setitem(other), type(other)


def test_only_a_value_no_guard_reads_that_pickle_cannot_save_becomes_torchs_sentinel():
    """A ContextVar, a lock or a generator no guard reads is saved as torch's ``_Missing``; one a
    guard reads, or one inside a container an EQUALS_MATCH reads whole, is left to pickle (and
    the entry out).  What pickle saves, or saves by name, is pickle's."""
    import contextvars
    import threading

    from stableguards.warm_start import pickling

    var, lock, gen = contextvars.ContextVar("v"), threading.Lock(), (i for i in range(2))
    pickler = types.SimpleNamespace(guard_tree_values={}, _verbatim_elements=set())
    assert all(pickling.unpicklable_bystander(pickler, value) for value in (var, lock, gen))
    pickler.guard_tree_values[id(var)] = var
    pickler._verbatim_elements.add(id(lock))
    assert not pickling.unpicklable_bystander(pickler, var) and not pickling.unpicklable_bystander(pickler, lock)
    for picklable in (object(), [var], {"v": var}, len, _RewritingRegistry, code_of, Fact):
        assert not pickling.unpicklable_bystander(pickler, picklable), picklable


def _state_init(optimizer, group: int = 0, source: str = "opt"):
    from torch._dynamo.source import LocalSource, OptimizerSource

    from stableguards.warm_start.hooks.optimizer_init import StateInit, _argument, _type_name, _without_state

    groups = optimizer.param_groups
    args = (groups[group], *[[] for _ in range(6)])  # Adam's _init_group, as Dynamo maps it
    return StateInit(OptimizerSource(LocalSource(source)), _type_name(optimizer), group,
                     tuple(_argument(a, groups) for a in args), (), _without_state(optimizer, group))


def test_a_fresh_optimizer_is_given_the_state_the_cold_trace_made_and_only_a_fresh_one():
    """The ``_init_group`` calls a cold trace made are made again on the frame's optimizer when it
    lacks state for the parameters that lacked it cold and is of the cold type: its state is
    then Adam's first state (the same as an eager step makes), and ``empty`` removes it again.
    An optimizer with other state, of another type, or missing from the frame is not touched;
    one restored for the group the cold one had restored is given state for the other."""
    import torch
    from torch._dynamo.variables.optimizer import OptimizerVariable

    from stableguards.warm_start.hooks import optimizer_init

    if not hasattr(OptimizerVariable, "_safe_to_set_capturable"):
        pytest.skip("the call is made as torch 2.15's Dynamo makes it (warm start is torch 2.15's)")

    def frame(opt):
        return types.SimpleNamespace(f_globals={}, f_locals={"opt": opt})

    def adam(cls=torch.optim.AdamW):
        params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
        opt = cls([{"params": params[:1]}, {"params": params[1:]}], lr=0.1)
        for p in params:
            p.grad = torch.full_like(p, 0.5)
        return opt

    opt = adam()
    saved = types.SimpleNamespace(stableguards_state_inits=(_state_init(opt, 0), _state_init(opt, 1)))
    assert saved.stableguards_state_inits[0].args[:2] == (("group", 0), ("list", None))
    filled = optimizer_init.fill_as_cold(saved, frame(opt))
    assert [m.optimizer for m in filled] == [opt, opt] and len(opt.state) == 2
    eager = adam()
    for group in eager.param_groups:  # what an eager step's own calls make
        eager._init_group(group, [], [], [], [], [], [])
    for p, q in zip(opt.state, eager.state):
        assert opt.state[p].keys() == eager.state[q].keys()
        assert all(torch.equal(opt.state[p][k], eager.state[q][k]) for k in opt.state[p])
    optimizer_init.empty(filled)
    assert not opt.state and isinstance(opt.state, dict)

    assert optimizer_init.fill_as_cold(saved, frame(adam(torch.optim.Adam))) == []  # another type
    assert optimizer_init.fill_as_cold(saved, types.SimpleNamespace(f_globals={}, f_locals={})) == []  # not there
    stepped = adam()
    stepped.step()
    before = {p: dict(s) for p, s in stepped.state.items()}
    assert optimizer_init.fill_as_cold(saved, frame(stepped)) == []  # not fresh: untouched
    assert all(stepped.state[p][k] is v for p, s in before.items() for k, v in s.items())
    assert optimizer_init.fill_as_cold(types.SimpleNamespace(), frame(opt)) == [] and not opt.state  # none saved

    # Restored from a checkpoint with state for the first group only (a layer added since):
    # cold, the trace filled the second group; warm, the same group is filled, and only it.
    partly = adam()
    partly.step()
    del partly.state[partly.param_groups[1]["params"][0]]
    first = {k: v.clone() for k, v in next(iter(partly.state.values())).items()}
    restored_once = types.SimpleNamespace(stableguards_state_inits=(_state_init(partly, 1),))
    assert restored_once.stableguards_state_inits[0].without_state == (0,)
    assert optimizer_init.fill_as_cold(restored_once, frame(stepped)) == []  # group 1 has state
    filled = optimizer_init.fill_as_cold(restored_once, frame(partly))
    assert len(partly.state) == 2 and [len(m.params) for m in filled] == [1]
    optimizer_init.empty(filled)
    assert len(partly.state) == 1
    assert all(torch.equal(v, first[k]) for k, v in next(iter(partly.state.values())).items())

    # A note another version saved (a field missing) is not used.
    old = copy.copy(restored_once.stableguards_state_inits[0])
    object.__delattr__(old, "without_state")
    assert optimizer_init.fill_as_cold(types.SimpleNamespace(stableguards_state_inits=(old,)), frame(partly)) == []
