"""Held-out scenarios for warm start: changes between a cold and a warm process that the
campaign's grammar (tests/_warm_campaign.py) does not draw, written as an adversary of
identity.objects, warm_start.facts and stableguards.operators would.  Not part of any
draw: tests/test_held_out.py runs them only with STABLEGUARDS_HELD_OUT=1, before an issue
about warm start's soundness is resolved.

Each scenario is one module, as the cold and as the warm process have it (``build()``
returns the function to compile; ``TRAIN``: a backward runs).  ``per_process``: its values
differ between processes with different hash seeds, unchanged or not.
"""

from __future__ import annotations

from dataclasses import dataclass

_HEAD = "import enum\nimport functools\n\nimport torch\n\nAMBIENT = 'none'\n"
_TAIL = "\n\ndef build():\n    return fn\n\n\ndef teardown():\n    pass\n"


@dataclass(frozen=True)
class Scenario:
    name: str
    body: str  # the module's code, with {v} where the two processes differ
    cold: str
    warm: str
    train: bool = False
    per_process: bool = False

    def source(self, warm: bool) -> str:
        body = self.body.replace("{ns}", f"sgho_{self.name}").replace("{v}", self.warm if warm else self.cold)
        return f"{_HEAD}TRAIN = {self.train}\n\n{body}{_TAIL}"


SCENARIOS = [
    Scenario("int_flag", "class F(enum.IntFlag):\n    A = 1\n    B = {v}\n\n\n"
                         "def fn(x):\n    return x * (F.A | F.B)\n", "2", "4"),
    Scenario("enum_by_value", "class L(enum.Enum):\n    LOW = 1\n    HIGH = {v}\n\n\n"
                              "def fn(x):\n    return x * 2 if L(1) is L.LOW and L.HIGH.value > 2 else x\n", "3", "0"),
    Scenario("enum_alias", "class L(enum.Enum):\n    A = 1\n    B = {v}\n\n\n"
                           "def fn(x):\n    return x * 2 if L.B is L.A else x * 3\n", "1", "2"),
    Scenario("tuple_hash", "def fn(x):\n    return x + hash(('a', {v})) % 5\n", "1", "1", per_process=True),
    Scenario("frozenset_global", "WORDS = frozenset({'aa', 'b', {v}})\n\n\n"
                                 "def fn(x):\n    for w in WORDS:\n        x = x * 2 + len(w)\n    return x\n",
             "'cccc'", "'cccc'", per_process=True),
    Scenario("sorted_set", "def fn(x):\n    for w in sorted({'aa', 'b', {v}}):\n        x = x * 2 + len(w)\n"
                           "    return x\n", "'cccc'", "'dd'"),
    Scenario("op_in_a_dict", "lib = torch.library.Library('{ns}', 'DEF')\n"
                             "lib.define('scale(Tensor x) -> Tensor')\n"
                             "lib.impl('scale', lambda t: t * {v}, 'CompositeImplicitAutograd')\n"
                             "OPS = {'scale': torch.ops.{ns}.scale.default}\n\n\n"
                             "def fn(x):\n    return OPS['scale'](x).sin()\n", "2.0", "3.0"),
    Scenario("kernel_reads_a_global", "K = {v}\nlib = torch.library.Library('{ns}', 'DEF')\n"
                                      "lib.define('scale(Tensor x) -> Tensor')\n\n\n"
                                      "def _scale(t):\n    return t * K\n\n\n"
                                      "lib.impl('scale', _scale, 'CompositeImplicitAutograd')\n\n\n"
                                      "def fn(x):\n    return torch.ops.{ns}.scale(x).cos()\n", "2.0", "3.0"),
    Scenario("partial_of_an_op", "lib = torch.library.Library('{ns}', 'DEF')\n"
                                 "lib.define('scale(Tensor x, float k) -> Tensor')\n"
                                 "lib.impl('scale', lambda t, k: t * k * {v}, 'CompositeImplicitAutograd')\n"
                                 "P = functools.partial(torch.ops.{ns}.scale, k=2.0)\n\n\n"
                                 "def fn(x):\n    return P(x).sin()\n", "1.0", "1.5"),
    Scenario("library_autograd", "lib = torch.library.Library('{ns}', 'DEF')\n"
                                 "lib.define('sq(Tensor x) -> Tensor')\n\n\n"
                                 "@torch.library.impl('{ns}::sq', 'cpu', lib=lib)\ndef _sq(t):\n    return t * t\n\n\n"
                                 "@torch.library.register_fake('{ns}::sq', lib=lib)\ndef _fake(t):\n"
                                 "    return torch.empty_like(t)\n\n\ndef _setup(ctx, inputs, output):\n"
                                 "    ctx.save_for_backward(inputs[0])\n\n\ndef _backward(ctx, grad):\n"
                                 "    t, = ctx.saved_tensors\n    return grad * t * {v}\n\n\n"
                                 "torch.library.register_autograd('{ns}::sq', _backward, setup_context=_setup, "
                                 "lib=lib)\n\n\n"
                                 "def fn(x):\n    return torch.ops.{ns}.sq(x).sin()\n", "2.0", "3.0", train=True),
    Scenario("enum_method_value", "class Mode(enum.Enum):\n    FAST = 'fast'\n\n    def scale(self):\n"
                                  "        return {v}\n\n\ndef fn(x):\n    return x * Mode.FAST.scale()\n",
             "2.0", "3.0"),
    Scenario("str_of_member", "class Mode(enum.Enum):\n    FAST = 'fast'\n    {v} = 'slow'\n\n\n"
                              "def fn(x):\n    return x * len(str(Mode('slow')))\n", "SLOW", "SLOWER"),
    # Against the memo-key rule, the namespace rule, the lambda path and the saved view's layout.
    Scenario("memo_relation", "class Cfg:\n    pass\n\n\nA = Cfg()\nB = A if {v} else Cfg()\n\n\n"
                              "def fn(x):\n    memo = {id(A): 2.0}\n    return x * memo.get(id(B), 3.0)\n",
             "True", "False"),
    Scenario("deepcopy_nested", "import copy\n\n\nclass Inner:\n    def __init__(self):\n        self.k = {v}\n\n\n"
                                "class Cfg:\n    def __init__(self):\n        self.inner = Inner()\n\n\n"
                                "CFG = Cfg()\n\n\n"
                                "def fn(x):\n    return x * copy.deepcopy(CFG).inner.k\n", "2.0", "3.0"),
    Scenario("memo_keys_summed", "class Cfg:\n    pass\n\n\nCFG = Cfg()\n\n\n"
                                 "def fn(x):\n    memo = {id(CFG): {v}}\n    return x + sum(memo) % 7\n", "1", "1",
             per_process=True),
    Scenario("id_through_a_descriptor", "class Cfg:\n    pass\n\n\nCFG = Cfg()\n\n\n"
                                        "def fn(x):\n    return x + id(CFG).real % {v}\n", "7", "7", per_process=True),
    Scenario("exec_namespace", "NS = {'K': {v}}\nexec('def g(t):\\n    return t * K', NS)\nG = NS['g']\n\n\n"
                               "def fn(x):\n    return G(x).sin()\n", "2.0", "3.0"),
    Scenario("class_lambda", "class A:\n    f = lambda self, t: t * {v}  # noqa: E731\n\n\n"
                             "def fn(x):\n    return A().f(x).cos()\n", "2.0", "3.0"),
    Scenario("view_stride", "def fn(x):\n    y = x[::{v}]\n    torch._dynamo.graph_break()\n"
                            "    return y * 2 if y.stride()[0] == 8 else y * 3\n", "1", "2"),
    # A class register_parametrization made, patched after it was made: its namespace differs.
    Scenario("parametrized_patched", "from torch.nn.utils import parametrize\n\n\n"
                                     "class Double(torch.nn.Module):\n"
                                     "    def forward(self, w):\n        return w * 2\n\n\n"
                                     "M = torch.nn.Linear(8, 8).requires_grad_(False)\n"
                                     "parametrize.register_parametrization(M, 'weight', Double())\n"
                                     "type(M).scale = property(lambda self: {v})\n\n\n"
                                     "def fn(x):\n    return M(x) * M.scale\n", "2.0", "3.0"),
]
