"""Backend fingerprints for this process: one ``Fingerprinter`` every part keys by (backends
match by it, warm start keys its entries by it, ``seams`` finds the backend a compile is for),
with what it needs to know of torch's own backend wrappers and one-object-per-name values.

The fingerprint itself is plain logic (``stableguards.fingerprint``); its tables (identity
tokens, torch's wrappers as first seen) are process state, kept here once.
"""

from __future__ import annotations

import functools
from typing import Any

from stableguards.fingerprint import BackendFingerprint, Fingerprinter
from stableguards.hooks.core import registered_name


def backend_fingerprint(backend: Any) -> BackendFingerprint:
    """The fingerprint of a backend as torch.compile or torch._dynamo.optimize received it."""
    return FINGERPRINTER.fingerprint(backend)


@functools.cache
def _torch_wrapper_types() -> tuple[type, ...]:
    """torch's own backend wrappers, whose __call__ only calls their parts (see backend_match)."""
    import torch
    from torch._dynamo.backends import common

    names = ("_TorchCompileInductorWrapper", "_TorchCompileAOTInductorWrapper", "_TorchCompileWrapper")
    found = tuple(getattr(torch, n) for n in names if isinstance(getattr(torch, n, None), type))
    aot = getattr(common, "AotAutograd", None)
    return found + ((aot,) if isinstance(aot, type) else ())


def _is_torch_wrapper(obj: Any) -> bool:
    return type(obj) in _torch_wrapper_types()


def _torch_name(obj: Any) -> str | None:
    """Names of torch objects that are one object per name: dtypes, devices, layouts, ops."""
    import torch

    if type(obj) in (torch.dtype, torch.device, torch.layout, torch.memory_format):
        return repr(obj)
    if type(obj) in (torch._ops.OpOverload, torch._ops.OpOverloadPacket):
        return f"op {obj}"
    return None


FINGERPRINTER = Fingerprinter(registered_name, _is_torch_wrapper, _torch_name)
