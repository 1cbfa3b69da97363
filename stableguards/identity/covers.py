"""What an identity covers, by the kind that starts it: ``python -m stableguards audit`` shows it
beside each object a saved entry trusts."""

from __future__ import annotations

COVERS = {
    "module": "the module of that name in sys.modules; what the code reads of it, Dynamo guards where it reads",
    "module-copy": "a copy of the module loaded from that file, bound on the entry's first call",
    "builtin": "what that import name finds; its C code by the version of its package (the interpreter's "
               "and torch's by the entry's key)",
    "code": "the bytecode, names, constants and nested code",
    "function": "its code, defaults, keyword defaults, what its closure holds (by these rules) and the module "
                "whose globals it reads (globals that are no module's: all they hold, by these rules); each "
                "global it reads Dynamo guards where it reads it",
    "hooked": "the function stableguards' hook wraps, and the hook",
    "class": "its import name, MRO and every function-like attribute along it (an Enum's members and values "
             "too); a value read from it Dynamo guards where it reads it",
    "enum": "its class, its name, its value, the builtin data it mixes in and its attributes",
    "parametrized": "the class it extends, and everything its own namespace holds (torch's properties for the "
                    "parametrized tensors, with their names; the module they were made for, as that)",
    "method": "the function and the object it is bound to",
    "partial": "the function, its arguments and keywords",
    "partialmethod": "the function, its arguments and keywords", "cached_property": "its function",
    "staticmethod": "the function", "classmethod": "the function", "property": "getter, setter and deleter",
    "weakref": "the object it refers to, or that it is dead",
    "instance": "its class and its state (a decorating context manager)",
    "optimizer": "its class and everything it holds (hyperparameters the guards check aside); tensors by "
                 "metadata, bound on the entry's first call",
    "tensor": "dtype, shape, strides, storage offset, device, requires_grad, leaf-ness and dispatch keys "
              "(bound on the entry's first call)",
    "object()": "a bare sentinel: only compared by identity within one process",
    "contents": "its class and everything its __dict__ holds, by these rules (an object whose id the trace "
                "used only as a key, bound on the entry's first call)",
    **{name: "its value" for name in ("NoneType", "bool", "int", "float", "complex", "str", "bytes", "ellipsis",
                                      "NotImplementedType", "tuple", "list", "frozenset", "set", "dict")},
}


def covers(description: str) -> str:
    """What ``description`` (one ``identity`` gave) covers, by its kind."""
    kind = description.partition(":")[0].partition("(")[0]
    if kind in COVERS:
        return COVERS[kind]
    return "its value" if "." in kind and kind.startswith("torch.") else "unknown kind: not an identity of this module"
