"""Which saved Dynamo entry a restarted process may install: the entry's identity.

torch can save a compiled frame (its guards, transformed bytecode and graph
artifacts) and install it in a new process without tracing again
(``torch._dynamo.package``).  It finds the entry by ``sha256(qualname + first
line)`` alone, so ``pkg_a.mod.f`` and ``pkg_b.mod.f`` at the same line share one,
every ``model.compile()`` shares ``Module._call_impl``'s, and neither the
backend, its options nor the compiler configuration take part: a warm process
could run another backend's code.

Here the entry's identity is an ordered list of named components, hashed into
the key the entry is stored under (as JAX builds its compilation cache key):
torch's own key first, then what it leaves out.  Each component is kept beside
the entry, so a miss can say which component changed.  Everything here is
plain Python; ``stableguards.warm_start.hooks`` feeds it torch's objects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stableguards.codes import code_digest, qualified
from stableguards.components import Components, digest_text, stable_repr
from stableguards.identity import fx_home


def entry_key(*, torch_key: str, fn: Any, backend: str, options: Mapping[str, Any],
              configs: Mapping[str, Mapping[str, Any]]) -> Components:
    """The identity of ``fn``'s entry.

    ``fn`` is what torch.compile was given, after unwrapping: a function or a
    bound method, whose receiver's class names the code it shares
    (``Module._call_impl``).  ``backend`` is the backend's stable fingerprint;
    ``options`` the other arguments of ``torch.compile`` that change what is
    traced (``dynamic``); ``configs`` the compiler configurations by name.
    """
    function = getattr(fn, "__func__", fn)
    code = function.__code__
    receiver = getattr(fn, "__self__", None)
    components = [
        ("torch_key", torch_key),
        ("module", str(getattr(function, "__module__", None))),
        ("qualname", function.__qualname__),
        ("file", source_file(code.co_filename)),
        ("code", code_digest(code)),
        ("receiver", qualified(type(receiver)) if receiver is not None else "-"),
        ("backend", backend),
    ]
    components += [(f"option.{name}", stable_repr(value)) for name, value in sorted(options.items())]
    components += [(f"config.{name}", config_digest(values)) for name, values in configs.items()]
    return Components(tuple(components))


# torch.fx names the code it generates by a per-process counter (<eval_with_key>.N); the
# module component names that code by its content (identity.fx_home).
_FX_FILE = "<torch.fx generated code>"


def source_file(filename: str) -> str:
    """The file a code object was read from, as an absolute path.  ``python train.py``
    records the path as given, relative to the working directory, and a restart launched
    as ``python /abs/train.py`` (runpy, a launcher) reads the same file under its absolute
    path.  Pseudo-files (``<string>``) stay as they are; torch.fx's generated code is named
    by what it is.

    One name for two spellings of one path cannot serve other code: the file only tells
    entries apart, while the module, the qualname and the code's digest name the code, and
    the entry's guards prove everything else it relied on."""
    if filename.startswith(fx_home.FILE_PREFIX):
        return _FX_FILE
    return filename if filename.startswith("<") else os.path.abspath(filename)


def config_digest(values: Mapping[str, Any]) -> str:
    """A configuration's settings, hashed in a way that does not depend on the process.

    Settings in ``NOT_CODE`` are left out: they name where this process writes
    debug output or how many workers compile, which depend on the working
    directory and the machine and not on what is compiled (torch's own FX-graph
    key leaves the inductor ones out for the same reason).  Everything else is
    kept: a setting not known to be harmless to ignore costs a miss, never a
    wrong hit.
    """
    kept = {name: value for name, value in values.items() if not name.startswith(NOT_CODE)}
    return digest_text("\n".join(f"{name}={stable_repr(value)}" for name, value in sorted(kept.items())))[:32]


# Setting names (prefixes) that never change compiled code: Dynamo's debug directory (the
# working directory's), inductor's trace output, CUTLASS checkout paths, and its compile
# workers (their count follows the machine's cores).
NOT_CODE = ("debug_dir_root", "trace.", "cuda.cutlass_dir", "cutlass.cutlass_dir", "xpu.cutlass_dir",
            "worker_start_method", "compile_threads", "compile_worker_")
