"""The grammar of warm start's cold/warm campaign: programs and the changes between runs.

A case is a program (a function or an ``nn.Module`` of one input, forward only
or with a backward) made of one to three features, run under an ambient
setting, and at most one change, made between the cold process and the warm
one as a restarted job would see it: a module global rebound, a helper
module's constant or function, a method patched on a class, a builtin
shadowed, a torch function rebound, a class attribute, a closure cell or a
mutable object a closure holds, a default, a dataclass or dict config, a global
object holding what pickle cannot save, a helper decorated with ``torch.no_grad()``,
an environment variable a branch reads,
an ``assume_constant_result`` function's input, a custom ``autograd.Function``'s forward,
a global its backward reads or its ``setup_context``, a function a decorator wraps or the decorator's argument or
wrapper, an enum member's value, a custom operator's kernel or backward, a parametrized layer's
parametrization, a string's hash or a set's iteration order (both per process: the hash seed),
a module hook of any kind or a global one, what a checkpointing policy
saves (a policy Dynamo never traces, reached through a global function, a
closure or a ``functools.partial``), a global the guards check and the graph does
not hold (the frame is traced again, into the same graph), saved-tensor hooks, grad, inference or
autocast mode (also entered for the calls only, ``torch.compile`` called
outside it: ``*_call``), the default dtype, a Dynamo or inductor setting, compiled
autograd, or nothing at all.  A graph break followed by a view leaves a graph
with nothing to compute; ``sum()`` of terms runs Dynamo's polyfill.  Under compiled autograd the compiled function is a
training step (``step``: the program, then its backward) as compiled autograd
runs a backward called in a compiled region.
``sources`` writes the case's modules for either process.

Hypothesis draws cases (``cases()``); tests/test_warm_campaign.py runs them.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from hypothesis import strategies as st

OPS = ("sin", "cos", "tanh", "sigmoid", "relu", "exp")
VALUES = (1.5, 2.0, 2.5, 3.0, 0.5)


@dataclass(frozen=True)
class Feature:
    """One thing a program reads.  ``change`` says whether the warm process sees it changed."""

    kind: str
    a: float
    b: float
    op_a: str
    op_b: str
    variant: int = 0


@dataclass(frozen=True)
class Case:
    name: str
    module: bool  # an nn.Module (a Linear, then the features) rather than a function
    train: bool  # the input requires grad, and the backward runs
    features: tuple[Feature, ...]
    ambient: str  # the context both processes call it under, unless it is what changes
    changed: int | None  # which feature changes (len(features): the ambient setting), or None

    def change_kind(self) -> str:
        if self.changed is None:
            return "none"
        return self.features[self.changed].kind if self.changed < len(self.features) else f"ambient:{self.ambient}"


FEATURES = ("module_global", "helper_constant", "helper_attribute", "function_rebound", "helper_function_rebound",
            "method_patched", "builtin_shadowed", "torch_function_rebound", "class_attribute", "closure_cell",
            "mutable_closure", "default_arg", "dataclass_config", "dict_config", "env_branch", "constant_function",
            "module_hook", "global_module_hook", "checkpoint_policy", "break_then_view", "sum_of_terms",
            "guard_only", "held_state", "no_grad_helper", "custom_function", "decorated", "enum_member",
            "custom_op", "str_hash", "set_order", "lambda_global", "namedtuple_default", "view_offset", "config_copy",
            "id_number", "parametrized")
# Changes torch itself serves stale with the flag off: its AOTAutograd key names a custom
# operator, not its kernels (docs/warm_start.md).  The flag-off runs are not held to eager there.
TORCH_STALE = {"custom_op"}
# Features whose values differ between two processes of one program (the hash seed): an
# unchanged case is compiled again where the processes' seeds differ, and starts warm where
# PYTHONHASHSEED fixes one.
PER_PROCESS = {"str_hash", "set_order", "id_number"}
# Ambient settings and what the changed process runs under instead.
AMBIENTS = {
    "none": "no_grad", "no_grad": "none", "inference_mode": "none", "autocast": "none", "float64": "none",
    "saved_tensor_hooks": "saved_tensor_hooks_changed",
    "inlined_saved_tensor_hooks": "inlined_saved_tensor_hooks_changed",
    "dynamo_setting": "dynamo_setting_changed", "inductor_setting": "inductor_setting_changed",
    "compiled_autograd": "none", "autocast_call": "none", "inference_mode_call": "none",
}
# Changes that need not show in the eager outputs: a setting that only changes how it compiles,
# modes that change no value, saved-tensor hooks that are other code with the same results.
UNOBSERVABLE = {"checkpoint_policy", "guard_only",
                "ambient:dynamo_setting", "ambient:inductor_setting", "ambient:no_grad", "ambient:none",
                "ambient:inference_mode", "ambient:float64", "ambient:autocast", "ambient:saved_tensor_hooks",
                "ambient:inlined_saved_tensor_hooks", "ambient:compiled_autograd", "ambient:autocast_call",
                "ambient:inference_mode_call"}
# Changes a warm process must compile again for, though they change no value: serving the old
# graph would keep the old policy's memory behaviour.
MUST_COMPILE = {"checkpoint_policy"}


@st.composite
def features(draw: st.DrawFn) -> Feature:
    a, b = draw(st.lists(st.sampled_from(VALUES), min_size=2, max_size=2, unique=True))
    op_a, op_b = draw(st.lists(st.sampled_from(OPS), min_size=2, max_size=2, unique=True))
    return Feature(draw(st.sampled_from(FEATURES)), a, b, op_a, op_b, draw(st.integers(0, 2)))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    module = draw(st.booleans())
    feats = tuple(draw(st.lists(features(), min_size=1, max_size=3, unique_by=lambda f: f.kind)))
    if not module:  # hooks need a module
        feats = tuple(f for f in feats if not f.kind.endswith("module_hook")) \
            or (Feature("module_global", 2.0, 3.0, "sin", "cos"),)
    ambient = draw(st.sampled_from(sorted(AMBIENTS)))
    train = draw(st.booleans()) and ambient not in ("no_grad", "inference_mode", "inference_mode_call")
    if ambient.endswith("saved_tensor_hooks") or ambient == "compiled_autograd":
        train = True  # the hooks act on a backward; compiled autograd compiles one
    if not train or ambient.endswith("saved_tensor_hooks"):  # a policy acts on a backward, without hooks
        feats = tuple(f for f in feats if f.kind != "checkpoint_policy") \
            or (Feature("module_global", 2.0, 3.0, "sin", "cos"),)
    if train and ambient.endswith("saved_tensor_hooks"):
        # torch 2.15's compiled backward asserts the strides of a view it is given where a pack
        # hook returns a copy (flag off too, without stableguards: `x[:, 1:]` after a graph break).
        feats = tuple(f for f in feats if f.kind != "view_offset") \
            or (Feature("module_global", 2.0, 3.0, "sin", "cos"),)
    changed = draw(st.one_of(st.none(), st.sampled_from(range(len(feats) + 1))))  # half unchanged
    return Case("case", module, train, feats, ambient, changed)


@dataclass
class _Program:
    helper: list[str] = field(default_factory=list)
    main: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    build: list[str] = field(default_factory=list)  # run in build(), on `net` for modules
    teardown: list[str] = field(default_factory=list)


def sources(case: Case, warm: bool) -> dict[str, str]:
    """The case's modules, ``<name>`` and ``<name>_helper``, as the cold or warm process has them."""
    p = _Program()
    helper = f"{case.name}_helper"
    for i, feature in enumerate(case.features):
        _feature(p, case, i, feature, warm and case.changed == i)
    ambient = case.ambient
    if warm and case.changed == len(case.features):
        ambient = AMBIENTS[ambient]
    # A backward that reads a saved tensor, so that saved-tensor hooks show in the gradients.
    last = ["y = y * y"] if case.train else []
    body = "\n".join(f"    {line}" for line in ["y = x", *p.steps, *last, "return y"])
    if case.module:
        program = ("class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        self.lin = torch.nn.Linear(8, 8)\n\n    def forward(self, x):\n"
                   + textwrap.indent(body.replace("y = x", "y = self.lin(x)", 1), "    ")
                   + "\n\n\ndef build():\n    torch.manual_seed(0)\n    net = Net().requires_grad_(TRAIN)\n"
                   + "".join(f"    {line}\n" for line in p.build) + "    return net\n")
    else:
        program = (f"def fn(x):\n{body}\n\n\ndef build():\n" + "".join(f"    {line}\n" for line in p.build)
                   + "    return fn\n")
    if case.ambient == "compiled_autograd":  # in both processes: only the setting changes
        program += ("\n\nMODEL = None\n\n\ndef step(x):\n    y = MODEL(x)\n    y.float().sum().backward()\n"
                    "    return y.detach()\n")
    teardown = "def teardown():\n" + "".join(f"    {line}\n" for line in p.teardown or ["pass"])
    main = ("import dataclasses\nimport os\n\nimport torch\nimport torch.nn.functional as F\n\n"
            f"import {helper} as helper\n"
            f"\nTRAIN = {case.train}\nAMBIENT = {ambient!r}\n_handles = []\n" + "\n".join(p.main) + "\n\n\n"
            + program + "\n\n" + teardown)
    return {case.name: main, helper: "import torch\n\n" + "\n".join(p.helper) + "\n"}


def _feature(p: _Program, case: Case, i: int, f: Feature, changed: bool) -> None:
    a, b, op_a, op_b = f.a, f.b, f.op_a, f.op_b
    kind = f.kind
    if kind == "module_global":
        p.main.append(f"K{i} = {b if changed else a}")
        p.steps.append(f"y = y * K{i}")
    elif kind == "helper_constant":  # the other module's source differs
        p.helper += [f"C{i} = {b if changed else a}", f"def scale{i}(t):\n    return t * C{i}"]
        p.steps.append(f"y = helper.scale{i}(y)")
    elif kind == "helper_attribute":  # the other module's attribute is set from here
        p.helper += [f"C{i} = {a}", f"def scale{i}(t):\n    return t * C{i}"]
        if changed:
            p.main.append(f"helper.C{i} = {b}")
        p.steps.append(f"y = helper.scale{i}(y)")
    elif kind == "function_rebound":
        p.main += [f"def act{i}_a(t):\n    return t.{op_a}()", f"def act{i}_b(t):\n    return t.{op_b}()",
                   f"ACT{i} = act{i}_{'b' if changed else 'a'}"]
        p.steps.append(f"y = ACT{i}(y)")
    elif kind == "helper_function_rebound":  # mod.act = my_act
        p.helper.append(f"def act{i}(t):\n    return t.{op_a}()")
        if changed:
            p.main += [f"def my_act{i}(t):\n    return t.{op_b}()", f"helper.act{i} = my_act{i}"]
        p.steps.append(f"y = helper.act{i}(y)")
    elif kind == "method_patched":
        p.helper.append(f"class Op{i}:\n    def apply(self, t):\n        return t.{op_a}()")
        p.main.append(f"OP{i} = helper.Op{i}()")
        if changed:
            p.main += [f"def _apply{i}(self, t):\n    return t.{op_b}()", f"helper.Op{i}.apply = _apply{i}"]
        p.steps.append(f"y = OP{i}.apply(y)")
    elif kind == "sum_of_terms":  # sum(): Dynamo inlines its polyfill, a copy of operator.py
        p.main.append(f"S{i} = {b if changed else a}")
        p.steps.append(f"y = sum(t * S{i} for t in (y, y.{op_a}()))")
    elif kind == "builtin_shadowed":
        if changed:
            p.main.append(f"def abs(t):\n    return t * {b}")
        p.steps.append("y = abs(y) + 0.5")
    elif kind == "torch_function_rebound":
        if changed:
            p.main += [f"_saved_{op_a}{i} = torch.{op_a}", f"torch.{op_a} = torch.{op_b}"]
            p.teardown.append(f"torch.{op_a} = _saved_{op_a}{i}")
        p.steps.append(f"y = torch.{op_a}(y)")
    elif kind == "class_attribute":
        p.main += [f"class Cfg{i}:\n    SCALE = {a}", f"CFG{i} = Cfg{i}()"]
        if changed:
            p.main.append(f"Cfg{i}.SCALE = {b}")
        p.steps.append(f"y = y * CFG{i}.SCALE")
    elif kind == "closure_cell":
        p.main += [f"def make{i}(k):\n    def f(t):\n        return t * k\n    return f",
                   f"F{i} = make{i}({b if changed else a})"]
        p.steps.append(f"y = F{i}(y)")
    elif kind == "mutable_closure":
        p.main += [f"STATE{i} = {{'k': {a}}}",
                   f"def make{i}(s):\n    def f(t):\n        return t * s['k']\n    return f",
                   f"G{i} = make{i}(STATE{i})"]
        if changed:
            p.main.append(f"STATE{i}['k'] = {b}")
        p.steps.append(f"y = G{i}(y)")
    elif kind == "default_arg":
        p.main.append(f"def d{i}(t, k={a}):\n    return t * k")
        if changed:
            p.main.append(f"d{i}.__defaults__ = ({b},)")
        p.steps.append(f"y = d{i}(y)")
    elif kind == "dataclass_config":
        p.main += [f"@dataclasses.dataclass\nclass DC{i}:\n    k: float = {a}\n    on: bool = True",
                   f"DCFG{i} = DC{i}({'k=' + str(b) if changed else ''})"]
        p.steps.append(f"y = y * DCFG{i}.k if DCFG{i}.on else y")
    elif kind == "dict_config":
        p.main.append(f"DICT{i} = {{'k': {a}, 'on': True}}")
        if changed:
            p.main.append(f"DICT{i}['on'] = False" if f.variant == 0 else f"DICT{i}['k'] = {b}")
        p.steps.append(f"y = y * DICT{i}['k'] if DICT{i}['on'] else y + 1")
    elif kind == "env_branch":  # the variable absent, or set to another value (variant 2), and then set
        var = f"SG_CAMPAIGN_{case.name.upper()}_{i}"
        if changed or f.variant == 2:
            p.main.append(f"os.environ[{var!r}] = {'1' if changed else '2'!r}")
            p.teardown.append(f"os.environ.pop({var!r}, None)")
        read = f"os.environ.get({var!r})" if f.variant == 0 else f"os.getenv({var!r}, '0')"
        p.steps.append(f"y = y + 1 if {read} == '1' else y * {a}")
    elif kind == "constant_function":
        p.main += [f"CONST{i} = {b if changed else a}",
                   f"@torch._dynamo.assume_constant_result\ndef const{i}():\n    return CONST{i}"]
        p.steps.append(f"y = y * const{i}()")
    elif kind == "module_hook":  # on the Linear, the same in both processes; changed: another kind of hook
        kinds = ("register_forward_hook(lambda m, i, o: o * {s})",
                 "register_forward_pre_hook(lambda m, a: (a[0] * {s},))",
                 "register_forward_hook(lambda m, a, k, o: o + {s}, with_kwargs=True)")
        p.main.append(f"def hook{i}(m, inputs, out):\n    return out * {a}")
        hook = kinds[f.variant].format(s=b) if changed else f"register_forward_hook(hook{i})"
        p.build.append(f"net.lin.{hook}")
    elif kind == "checkpoint_policy":  # which op the policy saves; its context_fn by variant
        saved = f"torch.ops.aten.{op_b if changed else op_a}.default"
        p.main.append("import functools\nfrom torch.utils.checkpoint import CheckpointPolicy, "
                      "create_selective_checkpoint_contexts")
        choose = "CheckpointPolicy.MUST_SAVE if op == {} else CheckpointPolicy.PREFER_RECOMPUTE"
        if f.variant == 1:  # a closure over the op
            p.main.append(f"def make_ctx{i}(saved):\n"
                          f"    def policy(ctx, op, *args, **kwargs):\n        return {choose.format('saved')}\n"
                          f"    def ctx():\n        return create_selective_checkpoint_contexts(policy)\n"
                          f"    return ctx\n"
                          f"CTX{i} = make_ctx{i}({saved})")
        else:  # a global policy reading a global, through a global function or a partial
            p.main.append(f"SAVED{i} = {saved}\n"
                          f"def policy{i}(ctx, op, *args, **kwargs):\n    return {choose.format(f'SAVED{i}')}\n"
                          f"def ctx_of{i}(policy):\n    return create_selective_checkpoint_contexts(policy)\n"
                          + (f"CTX{i} = functools.partial(ctx_of{i}, policy{i})" if f.variant == 2 else
                             f"def CTX{i}():\n    return ctx_of{i}(policy{i})"))
        p.main.append(f"def ck{i}(t):\n    return t.{op_a}().{op_b}() * {a}")
        p.steps.append(f"y = torch.utils.checkpoint.checkpoint(ck{i}, y, use_reentrant=False, context_fn=CTX{i})")
    elif kind == "guard_only":  # a global Dynamo guards on and the graph does not hold: the same graph
        p.main.append(f"LEVEL{i} = {3 if changed else 2}")
        p.steps.append(f"y = y * {a} if LEVEL{i} > 1 else y")
    elif kind == "break_then_view":  # the resumed graph may compute nothing: a view of its input
        p.main.append(f"K{i} = {b if changed else a}")
        p.steps += [f"y = y * K{i}", "torch._dynamo.graph_break()", "y = y.view_as(y)"]
    elif kind == "lambda_global":  # a module-level lambda (its code has no qualname of its own)
        p.main.append(f"ACT{i} = lambda t: t.{op_b if changed else op_a}() * {a}")
        p.steps.append(f"y = ACT{i}(y)")
    elif kind == "namedtuple_default":
        # A namedtuple with a default, from another module: Dynamo inlines its __new__, made by
        # eval in a namespace of its own.  Changed: the default (variant 0) or the field read (1).
        p.helper.append(f"import collections\n\nPair{i} = collections.namedtuple('Pair{i}', ['lo', 'hi'], "
                        f"defaults=[{b if changed and not f.variant else a}])")
        p.steps.append(f"y = y * helper.Pair{i}({a * 2}).{'lo' if changed and f.variant else 'hi'}")
    elif kind == "view_offset":
        # After a graph break, a branch on a view's storage offset (the resumed frame takes the
        # view).  Changed: where the view starts.
        start = 2 if changed else 1
        p.steps += [f"y = y[:, {start}:]", "torch._dynamo.graph_break()",
                    f"y = y * {a} if y.storage_offset() == 1 else y * {b}"]
    elif kind == "config_copy":
        # A config object from another module deep-copied in the step, as T5's and BART's caches
        # do: Dynamo folds id() of each object for deepcopy's memo.  Changed: a value it holds
        # (variant 0), or one in a dict it holds (1).
        k = b if changed else a
        p.helper.append(f"class Config{i}:\n    def __init__(self):\n        self.scale = {a if f.variant else k}\n"
                        f"        self.table = {{'k': {k if f.variant else a}}}\n\nCONFIG{i} = Config{i}()")
        p.main.append("import copy")
        p.steps += [f"cfg{i} = copy.deepcopy(helper.CONFIG{i})",
                    f"y = y * (cfg{i}.table['k'] if {f.variant} else cfg{i}.scale)"]
    elif kind == "parametrized":
        # A linear layer with a parametrized tensor: register_parametrization makes a class for it
        # at run time, which no name finds.  The program's own layer, or a global one in a
        # function.  Changed: the parametrization's op (variant 0), its scale (1), or which
        # tensor it parametrizes (2: the bias).
        op, k = (op_b if changed and f.variant == 0 else op_a), (b if changed and f.variant == 1 else a)
        name = "bias" if changed and f.variant == 2 else "weight"
        p.main.append(f"from torch.nn.utils import parametrize\n\n\nclass Param{i}(torch.nn.Module):\n"
                      f"    def forward(self, w):\n        return w.{op}() * {k}")
        if case.module:
            p.build.append(f"parametrize.register_parametrization(net.lin, {name!r}, Param{i}())")
        else:  # made in build(), under the ambient setting (the default dtype), as the module is
            p.main.append(f"PLIN{i} = None\n\n\ndef _plin{i}(name):\n"
                          f"    layer = torch.nn.Linear(8, 8).requires_grad_(False)\n    with torch.no_grad():\n"
                          f"        layer.weight.copy_(torch.linspace(-0.5, 0.5, 64).view(8, 8))\n"
                          f"        layer.bias.fill_(0.1)\n"
                          f"    parametrize.register_parametrization(layer, name, Param{i}())\n    return layer")
            p.build += [f"global PLIN{i}", f"PLIN{i} = _plin{i}({name!r})"]
            p.steps.append(f"y = PLIN{i}(y)")
    elif kind == "id_number":  # an object's id read as a number: each process's own
        p.helper.append(f"class Marker{i}:\n    pass\n\nMARKER{i} = Marker{i}()")
        p.steps.append(f"y = y + id(helper.MARKER{i}) % 1009 / 100")
    elif kind == "held_state":
        # A global object holding a ContextVar (no guard reads it; pickle cannot save it) and a
        # dict subclass whose __setitem__ changes the key (pickle rebuilds it through that),
        # as transformers' output capture has them.  Changed: the object's scale (variant 0),
        # the value the registry holds (1), or that and the order of its keys (2).
        k, r = (b if changed and f.variant == 0 else a), (b if changed and f.variant else a)
        items = [f"REG{i}[0] = 1.0", f"REG{i}[1] = {r}"]
        p.main += ["import contextvars",
                   f"class Holder{i}:\n    def __init__(self, k):\n"
                   f"        self.var = contextvars.ContextVar('held{i}', default=None)\n        self.k = k",
                   f"class Registry{i}(dict):\n    def __setitem__(self, key, value):\n"
                   f"        super().__setitem__(f'k{{key}}', value)\n\n    def get_k(self, key):\n"
                   f"        return super().get(f'k{{key}}')",
                   f"HOLDER{i} = Holder{i}({k})", f"REG{i} = Registry{i}()",
                   *(reversed(items) if changed and f.variant == 2 else items)]
        p.steps.append(f"y = y * HOLDER{i}.k * REG{i}.get_k(1)")
    elif kind == "no_grad_helper":
        # A helper in another module decorated with torch.no_grad() (torch.nn.utils.clip_grad's
        # helpers are): Dynamo checks the type of what its wrapper's closure holds, a bound
        # method (the decorator's clone).  Changed: the helper's constant.
        p.helper += [f"C{i} = {b if changed else a}",
                     f"@torch.no_grad()\ndef offset{i}(t):\n    return t.{op_a}() * C{i}"]
        p.steps.append(f"y = y + helper.offset{i}(y)")
    elif kind == "custom_function":
        # A custom autograd.Function in another module, as a library defines one.  Changed: its
        # forward's constant (variant 0); a global of its module its backward reads (1), or
        # with setup_context, the value setup_context keeps for the backward (2): each only
        # where a backward runs, else the forward's op.
        backward_only = changed and f.variant and case.train
        fwd = b if changed and not backward_only else a
        bwd = b if backward_only else a
        op = op_b if changed and f.variant and not case.train else op_a
        if f.variant == 2:
            p.helper.append(f"class Fn{i}(torch.autograd.Function):\n    @staticmethod\n    def forward(t):\n"
                            f"        return t.{op}() * {fwd}\n\n    @staticmethod\n"
                            f"    def setup_context(ctx, inputs, output):\n        ctx.save_for_backward(inputs[0])\n"
                            f"        ctx.k = {bwd}\n\n    @staticmethod\n    def backward(ctx, grad):\n"
                            f"        t, = ctx.saved_tensors\n        return grad * t * ctx.k")
        else:
            p.helper.append(f"G{i} = {bwd}\n\nclass Fn{i}(torch.autograd.Function):\n    @staticmethod\n"
                            f"    def forward(ctx, t):\n        ctx.save_for_backward(t)\n"
                            f"        return t.{op}() * {fwd}\n\n    @staticmethod\n    def backward(ctx, grad):\n"
                            f"        t, = ctx.saved_tensors\n        return grad * t * G{i}")
        p.steps.append(f"y = helper.Fn{i}.apply(y)")
    elif kind == "decorated":
        # A function wrapped by a decorator from another module that closes over it and over
        # the decorator's argument (transformers wraps its forwards so).  Changed: the
        # argument (variant 0), the wrapped function's body (1), the wrapper's body (2).
        wrap = "fn(t) + k" if changed and f.variant == 2 else "fn(t) * k"
        p.helper.append(f"import functools\n\ndef scaled{i}(k):\n    def deco(fn):\n"
                        f"        @functools.wraps(fn)\n        def wrapper(t):\n            return {wrap}\n"
                        f"        return wrapper\n    return deco")
        k = b if changed and f.variant == 0 else a
        op = op_b if changed and f.variant == 1 else op_a
        p.main.append(f"@helper.scaled{i}({k})\ndef act{i}(t):\n    return t.{op}()")
        p.steps.append(f"y = act{i}(y)")
    elif kind == "enum_member":
        # An enum member from another module: an IntEnum's, which Dynamo checks by id and folds
        # as its int (variant 0), a plain Enum's value (1), or an attribute its __init__ set (2).
        # Changed: that value.
        k = b if changed else a
        if f.variant == 0:
            p.helper.append(f"import enum\n\nclass Lvl{i}(enum.IntEnum):\n    K = {int(k * 2)}")
            p.steps.append(f"y = y * helper.Lvl{i}.K")
        elif f.variant == 1:
            p.helper.append(f"import enum\n\nclass Lvl{i}(enum.Enum):\n    K = {k}")
            p.steps.append(f"y = y * helper.Lvl{i}.K.value")
        else:
            p.helper.append(f"import enum\n\nclass Lvl{i}(enum.Enum):\n    K = (1, {k})\n\n"
                            f"    def __init__(self, tag, scale):\n        self.scale = scale")
            p.steps.append(f"y = y * helper.Lvl{i}.K.scale")
    elif kind == "custom_op":
        # A custom operator from another module, as a library defines one (named per case and
        # feature).  Changed: a torch.library kernel for CompositeImplicitAutograd, whose
        # decomposition the graph holds (variant 0); a custom_op's backward where one runs,
        # else its kernel (1); the kernel of an operator another one's kernel calls by name (2).
        ns = f"sgc_{case.name}_{i}"
        k = b if changed else a
        if f.variant == 1:
            fwd, bwd = (b if changed and not case.train else a), (b if changed and case.train else a)
            p.helper.append(f"@torch.library.custom_op('{ns}::act', mutates_args=())\n"
                            f"def act{i}(t: torch.Tensor) -> torch.Tensor:\n    return t.{op_a}() * {fwd}\n\n"
                            f"@act{i}.register_fake\ndef _fake{i}(t):\n    return torch.empty_like(t)\n\n"
                            f"def _setup{i}(ctx, inputs, output):\n    ctx.save_for_backward(inputs[0])\n\n"
                            f"def _backward{i}(ctx, grad):\n    t, = ctx.saved_tensors\n    return grad * t * {bwd}\n\n"
                            f"act{i}.register_autograd(_backward{i}, setup_context=_setup{i})")
            p.steps.append(f"y = helper.act{i}(y)")
        elif f.variant == 2:  # an operator whose kernel calls another by name: the inner one changes
            p.helper.append(f"lib{i} = torch.library.Library('{ns}', 'DEF')\n"
                            f"lib{i}.define('inner(Tensor x) -> Tensor')\n"
                            f"lib{i}.define('outer(Tensor x) -> Tensor')\n\ndef _inner{i}(t):\n    return t * {k}\n\n"
                            f"def _outer{i}(t):\n    return torch.ops.{ns}.inner(t).{op_a}()\n\n"
                            f"lib{i}.impl('inner', _inner{i}, 'CompositeImplicitAutograd')\n"
                            f"lib{i}.impl('outer', _outer{i}, 'CompositeImplicitAutograd')")
            p.steps.append(f"y = torch.ops.{ns}.outer(y)")
        else:
            p.helper.append(f"lib{i} = torch.library.Library('{ns}', 'DEF')\n"
                            f"lib{i}.define('scale(Tensor x) -> Tensor')\n\n"
                            f"def _scale{i}(t):\n    return t.{op_a}() * {k}\n\n"
                            f"lib{i}.impl('scale', _scale{i}, 'CompositeImplicitAutograd')")
            p.steps.append(f"y = torch.ops.{ns}.scale(y)")
    elif kind == "str_hash":
        # hash() of a string, which Dynamo folds with no guard.  Changed: the string.
        p.steps.append(f"y = y + hash({('warm' if changed else 'cold') + str(i)!r}) % 1009 / 100")
    elif kind == "set_order":
        # A set of strings iterated, in the process's hash order, which Dynamo folds: a literal
        # in the code (variant 0) or a global (1, 2).  Changed: one of its words.
        words = f"{{'alpha', 'be', {'delta!' if changed else 'gamma'!r}}}"
        p.main.append(f"WORDS{i} = {words}" if f.variant else "")
        p.main.append(f"def words{i}(t):\n    for w in {f'WORDS{i}' if f.variant else words}:\n"
                      f"        t = t * {a} + len(w)\n    return t")
        p.steps.append(f"y = words{i}(y)")
    elif kind == "global_module_hook":
        # Not on the module torch.compile wraps a module in (OptimizedModule): it is one more
        # module call than eager makes, so the hook would scale the compiled output once more.
        if changed:
            p.main.append(f"def ghook{i}(m, inputs, out):\n"
                          f"    wrapper = isinstance(m, torch._dynamo.eval_frame.OptimizedModule)\n"
                          f"    return out * {b} if isinstance(out, torch.Tensor) and not wrapper else out")
            p.build.append(f"_handles.append(torch.nn.modules.module.register_module_forward_hook(ghook{i}))")
            p.teardown.append("[h.remove() for h in _handles]")
