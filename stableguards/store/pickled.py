"""Whether an artifact in the store is one torch wrote, read without unpickling it.

inductor and AOTAutograd unpickle what their remote cache returns and then use it as their
own kind of entry: anything else (a pickle of another object under a valid record, written by
another program or version) crashes the compile.  ``top_class`` reads the class a pickle
builds from its opcodes (``pickletools`` parses, it runs nothing), so such an artifact is a
miss instead.  It answers for pickles as Python writes an instance (the class named before
anything inside it); a pickle it cannot read is not torch's.
"""

from __future__ import annotations

import base64
import binascii
import json
import pickletools

_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_GETS = {"BINGET", "LONG_BINGET", "GET"}
_PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}


def top_class(content: bytes) -> tuple[str, str] | None:
    """(module, qualified name) of the first class ``content`` names, or None."""
    strings: list[str | None] = []  # what the opcodes so far pushed, strings only
    memo: dict[int, str | None] = {}
    try:
        for op, arg, _ in pickletools.genops(content):
            if op.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                return module, name
            if op.name == "STACK_GLOBAL":
                module, name = strings[-2:] if len(strings) >= 2 else (None, None)
                return (module, name) if isinstance(module, str) and isinstance(name, str) else None
            if op.name in _STRINGS:
                strings.append(str(arg))
            elif op.name in _GETS:
                strings.append(memo.get(arg))
            elif op.name == "MEMOIZE":
                memo[len(memo)] = strings[-1] if strings else None
            elif op.name in _PUTS:
                memo[arg] = strings[-1] if strings else None
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return None


def artifact_class(data: bytes) -> tuple[str, str] | None:
    """The class of the entry in an artifact as torch's remote caches store one: JSON whose
    ``data`` is the base64 of a pickle.  None for anything else."""
    try:
        record = json.loads(data)
        pickled = record.get("data") if isinstance(record, dict) else None
        if not isinstance(pickled, (str, bytes)):
            return None
        return top_class(base64.b64decode(pickled, validate=True))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
