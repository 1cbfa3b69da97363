"""The frames Dynamo traces in this process, for the child processes that report them.

One ``InstructionTranslator`` per traced frame, resume functions included.  Dynamo's
``counters["frames"]`` counts every call into its frame converter, also one that installed a
saved entry and traced nothing.  Importing this module starts the count.
"""

from __future__ import annotations

import types

import torch._dynamo.symbolic_convert as symbolic_convert

TRACED: list[types.CodeType] = []
_init = symbolic_convert.InstructionTranslator.__init__


def _count(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    TRACED.append(self.f_code)


symbolic_convert.InstructionTranslator.__init__ = _count


def names() -> list[str]:
    return [code.co_name for code in TRACED]
