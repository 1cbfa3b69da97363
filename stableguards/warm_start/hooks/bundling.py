"""AOTAutograd entries of ours: bundled (a package saves its graphs from them), keyed as without a
package, and counted as the FX-graph hits they stand for (their kernels load without C++ build
work: ``kernels``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

from stableguards.hooks.core import Hook
from stableguards.warm_start.hooks import graph_params
from stableguards.warm_start.hooks.signals import leave_out
from stableguards.warm_start.state import STATE

_AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"
_PACKAGE = "torch._dynamo.package"


def _bundle_autograd_entries(call: Any) -> bool:
    """AOTAutograd entries of ours are bundled (self-contained): a package saves its graphs
    from them.  Any other compile bundles as the user's settings say."""
    return STATE.compiling.get().bundling or call()


def _compile_backward(call: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """A backward compiled on first use, for a graph of ours: its entry is bundled too.  One
    whose module compiled autograd traces as a restart loads it (``_save_when_traced``) is
    compiled from the module torch made, as it would be."""
    backend_id = getattr(self.aot_config, "precompile_backend_id", None)
    if backend_id not in STATE.backend_ids:
        return call(self, *args, **kwargs)
    lazy = self.lazy_backward_info
    made = getattr(lazy, "stableguards_made", None)
    with _bundled_backward_of(backend_id):
        if made is not None:
            traced, lazy.bw_module = lazy.bw_module, made
        try:
            return call(self, *args, **kwargs)
        finally:
            if made is not None:
                lazy.bw_module = traced


@contextlib.contextmanager
def _bundled_backward_of(backend_id: str | None) -> Iterator[None]:
    """The entry saved in here is bundled, and is the backward of the graph ``backend_id``."""
    with STATE.compiling_as(bundling=True, backward_of=backend_id):
        yield


def _save_when_traced(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Under compiled autograd, a graph of ours saves its entry when its backward is first used,
    whoever uses it.

    AOTAutograd compiles a backward graph on its first use, and saves the
    graph's entry (and hands its artifact to the package) only then; compiled
    autograd never uses it (it traces the backward module instead), so the
    entry was never saved and every restart compiled the forward again.  The
    backward stays torch's lazy one.  Where compiled autograd traces it first
    (``_traced_backward``), the entry is saved then, holding the backward module
    uncompiled (``GraphModuleCode``): compiled autograd re-traces that module in
    a restarted process, as torch does for any cached entry, and compiling it
    would cost a compile compiled autograd never runs.  Where a backward runs
    first without compiled autograd (called outside the compiled region), torch
    compiles it and saves the entry, as it would.  The entry is keyed apart
    from torch's (``_reduce_aot_config``): only a compile under compiled
    autograd finds it.  A graph whose cache torch bypasses (hooks registered in
    the compiled region: ``BackwardState``) has no entry to save and is left as
    it is."""
    import inspect

    bound = inspect.signature(call.fn).bind(*args, **kwargs).arguments
    lazy, aot_config = bound["lazy_backward_info"], bound["aot_config"]
    save = bound["try_save_cache_entry"]  # None where torch bypasses the cache or saved already
    if bound["compiled_bw_func"] is None and lazy is not None and save is not None and _under_compiled_autograd(
            aot_config):
        # Saved as torch saves it: the module torch made, which a restart loads as _as_loaded does.
        lazy.stableguards_save_traced = functools.partial(save, bw_module=lazy.bw_module,
                                                          _fw_metadata=bound["fw_metadata"], aot_config=aot_config)
        if (loaded := _as_loaded(lazy.bw_module)) is not None:
            lazy.stableguards_made, lazy.bw_module = lazy.bw_module, loaded
    return call(*args, **kwargs)


def _traced_backward(call: Any, self: Any, pinputs: Any, psaved_tensors: Any, saved_tensors: Any, pctx: Any,
                     ctx: Any, *args: Any, **kwargs: Any) -> Any:
    """Compiled autograd traced a graph's backward module: the entry waiting for it
    (``_save_when_traced``) is saved now, the backward uncompiled, once.  One whose backward
    torch compiled already (run without compiled autograd first) was saved then."""
    result = call(self, pinputs, psaved_tensors, saved_tensors, pctx, ctx, *args, **kwargs)
    forward_cls = getattr(ctx, "_forward_cls", None)
    lazy = getattr(forward_cls, "_lazy_backward_info", None)
    save = lazy.__dict__.pop("stableguards_save_traced", None) if lazy is not None else None
    if save is None or forward_cls.compiled_bw is not None:
        return result
    import torch

    # The backward runs under the callback of the compiled frame that called it: Dynamo must
    # not trace the saving code.
    torch._dynamo.disable(_save_traced)(save)
    return result


def _save_traced(save: Any) -> None:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    from stableguards.warm_start.hooks.no_compute import GraphModuleCode

    backend_id = getattr(save.keywords["aot_config"], "precompile_backend_id", None)
    # Saved outside compiled autograd's trace.
    with _bundled_backward_of(backend_id), unset_fake_temporarily(), disable_proxy_modes_tracing():
        save(GraphModuleCode(gm=save.keywords["bw_module"]))


def _under_compiled_autograd(aot_config: Any) -> bool:
    """Whether a graph of ours compiled now saves its entry for compiled autograd
    (``_save_when_traced``): unless the user has torch compile every backward with its
    forward (``force_non_lazy_backward_lowering``)."""
    return STATE.compiling.get().bundling and _compiled_autograd_on() and not aot_config.force_non_lazy_backward_lowering


def _as_loaded(bw_module: Any) -> Any:
    """The backward module a restarted process gets from the saved entry, or None.

    torch saves the backward module as its Python code and loads it by tracing
    that code again (``GraphModule.__reduce__``): node names change, and a call
    with no tensor inputs (``full``, ``iota``) runs at load, its result kept as a
    constant.  Compiled autograd copies this module into its own graph, so the
    graph it made in a restarted process was not the cold one, and missed the
    FX-graph cache there.  Given the module a restart loads, compiled autograd
    makes one graph in both processes.  A call that would run at load and is
    random (a seeded op with no tensor inputs) would become one fixed tensor:
    such a module is kept as it is (a restart compiles its graph again, as torch
    does), as is one that does not load again."""
    import copy

    import torch
    from torch._functorch._aot_autograd.aot_autograd_result import serialize_graph_module

    for node in bw_module.graph.nodes:
        if (node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
                and not node.all_input_nodes):
            return None
    try:
        with torch._subclasses.fake_tensor.unset_fake_temporarily():  # the loaded constants are real tensors
            return serialize_graph_module(copy.deepcopy(bw_module)).deserialize()
    except Exception:  # noqa: BLE001 - a module torch could not load either: kept, as torch would
        return None


def _compiled_autograd_on() -> bool:
    """Whether compiled autograd runs a backward called now (its setting or its context)."""
    import torch._dynamo.compiled_autograd as compiled_autograd
    import torch._dynamo.config as dynamo_config

    return bool(dynamo_config.compiled_autograd or compiled_autograd.compiled_autograd_enabled)


def _save_aot_entry(call: Any, *compiled_fns: Any) -> bool:
    """Whether AOTAutograd saves a graph's entry.  A bundled entry holds inductor's compiled
    code; for a graph with nothing to compute inductor returns the graph module's
    ``forward``, which ``_bundled_entry`` bundles as it is (``no_compute``).  Anything
    else bundling cannot hold (torch 2.15 fails the compile: "expected OutputCode") is
    saved as the user's settings say, and left out of its entry."""
    if not STATE.compiling.get().bundling or all(_bundleable(fn) for fn in compiled_fns if fn is not None):
        return call(*compiled_fns)
    with STATE.compiling_as(bundling=False):
        saved = call(*compiled_fns)
    leave_out("inductor returned something other than compiled code for a graph: there is nothing to save")
    return saved


def _bundleable(fn: Any) -> bool:
    from torch._inductor.output_code import OutputCode

    from stableguards.warm_start.hooks.no_compute import graph_without_calls, unwrapped

    return isinstance(unwrapped(fn), OutputCode) or graph_without_calls(fn) is not None


def _bundled_entry(call: Any, compiled_fw_func: Any, compiled_bw_func: Any, *args: Any, **kwargs: Any) -> Any:
    """A bundled entry of ours for a graph with nothing to compute holds the graph module
    itself (``GraphModuleCode``), the one inductor returned to run: the same code runs in
    the process that loads it.  The compiled function this process runs is unchanged."""
    if STATE.compiling.get().bundling:
        from stableguards.warm_start.hooks.no_compute import GraphModuleCode, graph_without_calls

        compiled_fw_func, compiled_bw_func = (
            fn if fn is None or (gm := graph_without_calls(fn)) is None else GraphModuleCode(gm=gm)
            for fn in (compiled_fw_func, compiled_bw_func))
    return call(compiled_fw_func, compiled_bw_func, *args, **kwargs)


def _user_bundles() -> bool:
    """Whether torch would bundle AOTAutograd entries with the user's settings alone."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    return bool(functorch_config.bundled_autograd_cache or dynamo_config.caching_precompile)


def _count_bundled_hit(call: Any, self: Any, example_inputs: Any) -> Any:
    """An inductor graph served from a bundled AOTAutograd entry counts as an FX-graph
    cache hit when only warm start bundles: unbundled, the same AOTAutograd hit
    reads the graph from the FX-graph cache and counts it there (the counter and
    the compile event), and users read them to see how much a cache saved."""
    from torch._inductor.output_code import CompiledFxGraph

    result = call(self, example_inputs)
    if STATE.compiling.get().bundling and not _user_bundles() and isinstance(result, CompiledFxGraph):
        from torch._dynamo.utils import CompileEventLogger, counters

        counters["inductor"]["fxgraph_cache_hit"] += 1
        CompileEventLogger.try_(CompileEventLogger.increment_toplevel, "inductor_fx_local_cache_hit_count")
    return result


def _add_backend_id(call: Any, self: Any, backend_id: str, *args: Any, **kwargs: Any) -> None:
    """A graph compiled for one of our packages: its backend id marks it ours wherever it
    compiles more (a backward on first use, a specialization at call time)."""
    if self in STATE.ours:
        STATE.backend_ids.add(backend_id)
        graph_params.record(backend_id)
    return call(self, backend_id, *args, **kwargs)


def _flattened(call: Any, self: Any, gm: Any, unflatten_fn: Any) -> None:
    """Compiled autograd's graph takes its inputs as a list Dynamo keeps whole (so that
    compiled autograd can free it early); inductor compiles it with flat inputs, behind a
    wrapper (``flatten_graph_inputs``) whose module drops the graph's backend id, so
    AOTAutograd recorded no artifact for the package.  The wrapper of one of our graphs
    carries the id, and the artifact is recorded with what flattens its inputs in a
    restart (``FlatInputsArtifact``).  Only compiled autograd's own layout (a list, then
    sizes and scalars: ``flatten_graph_inputs``' fast path) is carried."""
    call(self, gm, unflatten_fn)
    import torch._dynamo.compiled_autograd as compiled_autograd

    backend_id = getattr(gm, "_backend_id", None)
    if not (_ours(backend_id) and compiled_autograd.in_compiled_autograd_region):
        return
    stolen = [i for i, node in enumerate(gm.graph.nodes)
              if node.op == "placeholder" and node.meta.get("steal_arg", False)]
    if stolen == [0]:
        self._backend_id = backend_id
        STATE.flattened.add(backend_id)


class FlatInputsArtifact:
    """A saved graph compiled with flat inputs (``_flattened``): the bundled AOTAutograd
    artifact, called as ``flatten_graph_inputs``' wrapper calls it.  The first argument is
    compiled autograd's list of tensors, flattened in front of the others and cleared (the
    list is the wrapper's to free, as in torch's)."""

    def __init__(self, key: str, content: Any) -> None:
        self.key, self.content = key, content

    def after_deserialization(self) -> Any:
        compiled = self.content.after_deserialization()

        def flattened(*args: Any) -> Any:
            flat = args[0] + list(args[1:])
            args[0].clear()
            return compiled(*flat)

        return flattened

    def edit_contents(self, edit_fn: Any) -> None:
        self.content.edit_contents(edit_fn)


def flat_inputs(artifact: Any) -> Any:
    """``artifact`` as it is recorded for a package: wrapped where its graph was compiled with
    flat inputs (``_flattened``)."""
    if artifact.key in STATE.flattened and not isinstance(artifact, FlatInputsArtifact):
        return FlatInputsArtifact(artifact.key, artifact)
    return artifact


def _ours(backend_id: str | None) -> bool:
    return backend_id is not None and (STATE.compiling.get().frame is not None or backend_id in STATE.backend_ids)


@contextlib.contextmanager
def _sanitized_for_key(call: Any, gm: Any) -> Iterator[None]:
    """A graph of ours keyed as it is without a package.  torch clears ``_backend_id`` while
    it computes the AOTAutograd key; set by a package compile it sits earlier in the
    graph module's ``__dict__`` than where clearing puts it, and the pickled dict, so
    the key, differs from a compile without a package (flag off, or a frame left out)."""
    backend_id = gm.__dict__.pop("_backend_id", None) if _ours(getattr(gm, "_backend_id", None)) else None
    try:
        with call(gm):
            yield
    finally:
        if backend_id is not None:
            gm._backend_id = backend_id


def _reduce_aot_config(call: Any, self: Any, aot_config: Any) -> Any:
    """AOTAutograd's cache key for our compiles, without the package's backend id.

    A package compile names its graph ``__compiled_fn_N_<uuid>``, new per
    compile, and torch puts that name in the AOTAutograd key, so every frame
    compiled under a package missed the AOTAutograd cache.  The name only labels
    the bundled artifact; on a hit torch records the artifact under the current
    compile's name, never the cached one.  So two keys that differ only there
    stand for the same compiled graph.  Other packages' keys are torch's.  Under
    compiled autograd, our entries are keyed apart (``_save_when_traced``)."""
    if not _ours(getattr(aot_config, "precompile_backend_id", None)):
        return call(self, aot_config)
    reduced, parts = call(self, dataclasses.replace(aot_config, precompile_backend_id=None))
    if _under_compiled_autograd(aot_config):
        # Its entry may hold the backward uncompiled (_save_when_traced): found only by a
        # compile under compiled autograd, never by one that would run that backward.
        parts = (*parts, "stableguards: saved under compiled autograd, its backward may be uncompiled")
    return reduced, parts


HOOKS = [
    # should_bundle_autograd_cache and graph_compile's by-name copy of it (lazy: they
    # import inductor).
    Hook(_AUTOGRAD_CACHE, "should_bundle_autograd_cache", "warm_start", _bundle_autograd_entries, lazy=True),
    Hook("torch._functorch._aot_autograd.graph_compile", "should_bundle_autograd_cache", "warm_start",
         _bundle_autograd_entries, lazy=True),
    Hook("torch._functorch._aot_autograd.runtime_wrappers", "_AutogradBackwardCompiler.get_or_compile",
         "warm_start", _compile_backward, lazy=True),
    Hook("torch._functorch._aot_autograd.graph_compile", "_aot_stage2c_make_autograd_function", "warm_start",
         _save_when_traced, params=("aot_config", "fw_metadata", "compiled_bw_func", "lazy_backward_info",
                                    "try_save_cache_entry"), lazy=True),
    Hook("torch._dynamo.compiled_autograd", "AutogradCompilerInstance.proxy_call_aot_backward", "warm_start",
         _traced_backward, params=("ctx",)),
    Hook("torch._functorch._aot_autograd.graph_compile", "_should_save_cache", "warm_start", _save_aot_entry,
         lazy=True),
    Hook(_AUTOGRAD_CACHE, "AOTAutogradCache.make_entry", "warm_start", _bundled_entry,
         params=("compiled_fw_func", "compiled_bw_func"), lazy=True),
    Hook("torch._functorch._aot_autograd.aot_autograd_result", "BundledOutputCodeLoadable.load", "warm_start",
         _count_bundled_hit, params=("example_inputs",), lazy=True),
    Hook(_AUTOGRAD_CACHE, "AOTAutogradCachePickler._reduce_aot_config", "warm_start", _reduce_aot_config,
         params=("aot_config",), lazy=True),
    Hook(_AUTOGRAD_CACHE, "sanitize_gm_for_cache", "warm_start", _sanitized_for_key, params=("gm",), lazy=True),
    Hook(_PACKAGE, "CompilePackage.add_backend_id", "warm_start", _add_backend_id, params=("backend_id",)),
    Hook("torch._dynamo.utils", "GmWrapper.__init__", "warm_start", _flattened, params=("gm", "unflatten_fn")),
]
