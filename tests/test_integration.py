"""The flag, the hooks and their failure modes, through real Dynamo compiles (eager backend)."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys

import torch
import torch._dynamo

import stableguards
from stableguards import hooks, registry
from stableguards.events import EVENTS
from stableguards.hooks import STATE
from stableguards.symbols.ids import home_slot
from stableguards.symbols.state import STATE as SYMBOLS


def graph_symbols(fn, *args) -> list[str]:
    """Symbols (SymInt/SymFloat values) in the graph Dynamo builds for ``fn``, in node order."""
    names: list[str] = []

    def backend(gm, example_inputs):
        names.extend(str(n.meta["example_value"]) for n in gm.graph.nodes
                     if isinstance(n.meta.get("example_value"), (torch.SymInt, torch.SymFloat)))
        return gm.forward

    torch.compile(fn, backend=backend, dynamic=True)(*args)
    return names


def upstream_id(source_name: str) -> int:
    return int(hashlib.sha256(source_name.encode()).hexdigest(), 16) % 100


def add(x, y):
    return x.sum() + y.sum()


def run(code: str, **env: str) -> str:
    full_env = {k: v for k, v in os.environ.items() if k != hooks.ENV_VAR}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, check=True)
    return proc.stdout.strip()


def test_flag_exists_after_plain_import_torch_without_loading_dynamo():
    out = run("import sys, torch\n"
              "print('torch._dynamo' in sys.modules)\n"
              "import torch._dynamo.config as c\n"
              "print(c.stable_guards)")
    assert out.split() == ["False", "False"]


def test_every_hook_installs_through_the_entry_point_alone():
    """No `import stableguards`: torch loads it, then Dynamo and inductor load lazily.
    Inductor's hooks must not be imported while torch._dynamo is still importing
    (a circular import that once left the library half installed)."""
    out = run("import logging, torch\n"
              "logging.basicConfig()\n"
              "torch.compile(lambda x: x + 1, backend='inductor')(torch.ones(2))\n"
              "import torch._inductor.cudagraph_trees\n"
              "from stableguards.hooks import STATE\n"
              "print(sorted(name for _, name in STATE.seams))\n"
              "from stableguards.events import EVENTS\n"
              "print(sorted(EVENTS._warned))", TORCHDYNAMO_STABLE_GUARDS="1")
    hooks, warned = out.splitlines()[-2:]
    for name in ("compiled_fx_graph_hash", "check_invariants", "map_sources_and_install_guards",
                 "_generate_unique_id", "get_compiler_fn"):
        assert name in hooks
    assert warned == "[]"


def test_environment_variable_turns_the_flag_on():
    code = "import torch._dynamo.config as c; print(c.stable_guards)"
    assert run(code, TORCHDYNAMO_STABLE_GUARDS="1") == "True"
    assert run(code, TORCHDYNAMO_STABLE_GUARDS="0") == "False"


def test_flag_works_with_config_patch_and_defaults_off():
    assert torch._dynamo.config.stable_guards is False
    with torch._dynamo.config.patch(stable_guards=True):
        assert torch._dynamo.config.stable_guards is True
    assert torch._dynamo.config.stable_guards is False


def test_flag_off_keeps_upstream_symbol_names(fresh_dynamo):
    names = graph_symbols(add, torch.randn(3), torch.randn(4))
    assert names == [f"s{upstream_id(src)}" for src in ("L['x'].size()[0]", "L['y'].size()[0]")]


def test_flag_on_gives_stable_names_and_flipping_takes_effect_next_compile(fresh_dynamo):
    with torch._dynamo.config.patch(stable_guards=True):
        on = graph_symbols(add, torch.randn(3), torch.randn(4))
    torch._dynamo.reset()
    off = graph_symbols(add, torch.randn(3), torch.randn(4))
    assert on == [f"s{home_slot(src)}" for src in ("L['x'].size()[0]", "L['y'].size()[0]")]
    assert off == [f"s{upstream_id(src)}" for src in ("L['x'].size()[0]", "L['y'].size()[0]")]


SOURCE_F = "L['f']"


def scale(x, f):
    return x * f


def test_float_symbols_use_the_stable_allocator_too(fresh_dynamo):
    with torch._dynamo.config.patch(stable_guards=True, specialize_float=False):
        names = graph_symbols(scale, torch.randn(3), 2.5)
    assert f"zf{home_slot(SOURCE_F)}" in names


def test_an_internal_error_warns_once_and_falls_back(fresh_dynamo, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("injected")

    monkeypatch.setattr(SYMBOLS, "symbol_id", broken)
    before = EVENTS.counters["fallbacks"]
    with caplog.at_level(logging.WARNING, logger="stableguards"), \
            torch._dynamo.config.patch(stable_guards=True):
        names = graph_symbols(add, torch.randn(3), torch.randn(4))
        torch._dynamo.reset()
        graph_symbols(add, torch.randn(5), torch.randn(6))
    assert names == [f"s{upstream_id(src)}" for src in ("L['x'].size()[0]", "L['y'].size()[0]")]
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("stableguards")]
    assert len(ours) == 1 and "injected" in ours[0], ours  # one warning for four failures
    assert EVENTS.counters["fallbacks"] - before == 4
    assert "injected" in stableguards.explain()


def test_an_unsupported_torch_warns_once_and_hooks_nothing(monkeypatch, caplog):
    hooks.uninstall()
    try:
        monkeypatch.setattr(torch, "__version__", "2.16.0")
        monkeypatch.delenv(hooks.UNTESTED_ENV_VAR, raising=False)
        with caplog.at_level(logging.WARNING, logger="stableguards"):
            hooks.install()
            hooks.install()
        assert STATE.seams == {}
        assert len(caplog.records) == 1 and "2.16.0" in caplog.records[0].message
        assert torch._dynamo.config.stable_guards is False  # the flag still exists
    finally:
        monkeypatch.undo()
        hooks.install()
    assert STATE.seams


def test_uninstall_restores_upstream(fresh_dynamo):
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    hooked = ShapeEnv._generate_unique_id
    hooks.uninstall()
    try:
        assert ShapeEnv._generate_unique_id is not hooked
        with torch._dynamo.config.patch(stable_guards=True):
            names = graph_symbols(add, torch.randn(3), torch.randn(4))
        assert names == [f"s{upstream_id(src)}" for src in ("L['x'].size()[0]", "L['y'].size()[0]")]
    finally:
        hooks.install()


def test_an_unknown_part_in_stableguards_disable_is_named(monkeypatch, caplog):
    monkeypatch.setattr(registry, "UNKNOWN_DISABLED", registry.disabled_parts("symbol,pgo")[1])
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        hooks.install()
    assert "names symbol," in caplog.text and "symbols, profiles, backends" in caplog.text


def test_stableguards_disable_takes_the_parts_earlier_names():
    """pgo, backend, optimizer and precompile were the parts' names before each had a package;
    optimizer covered hyperparameter lifting too."""
    parts, unknown = registry.disabled_parts("pgo, backend,optimizer,precompile")
    assert parts == {"profiles", "backends", "optimizers", "hyperparams", "warm_start"} and not unknown
    assert registry.disabled_parts("hyperparams") == ({"hyperparams"}, frozenset())


def test_an_untested_torch_opted_in_gets_every_part_whose_hook_points_fit(monkeypatch, caplog):
    """STABLEGUARDS_UNTESTED_TORCH=1: the same shape checks run; a part that does not fit
    stays off, named in a warning, and the others go in."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    [symbol_hook] = hooks.hook_tables()["symbols"]
    fitting = set(STATE.installed)  # every part whose hook points fit this torch
    hooks.uninstall()
    try:
        monkeypatch.setattr(torch, "__version__", "2.99.0")
        monkeypatch.setenv(hooks.UNTESTED_ENV_VAR, "1")
        monkeypatch.setattr(symbol_hook, "params", ("source_name", "a_parameter_torch_renamed"))
        with caplog.at_level(logging.WARNING, logger="stableguards"):
            hooks.install()
        assert "symbols" not in STATE.installed and {"profiles", "backends", "optimizers"} <= STATE.installed
        assert not hasattr(ShapeEnv._generate_unique_id, "__stableguards_hook__")
        [warning] = [r.getMessage() for r in caplog.records]
        assert "'symbols'" in warning and "a_parameter_torch_renamed" in warning
    finally:
        monkeypatch.undo()
        hooks.uninstall()
        hooks.install()
    assert STATE.installed == fitting


def test_a_part_left_to_torch_changes_only_that_part(fresh_dynamo, monkeypatch):
    """STABLEGUARDS_DISABLE=backends: symbols stay stable, cache entries are torch's."""
    monkeypatch.setattr(registry, "DISABLED", frozenset({"backends"}))
    import torch._C._dynamo.eval_frame as c_eval_frame

    with torch._dynamo.config.patch(stable_guards=True):
        names = graph_symbols(add, torch.randn(3), torch.randn(4))
        torch._dynamo.reset()
        torch.compile(add, backend="eager")(torch.ones(2), torch.ones(2))
    assert names == [f"s{home_slot(src)}" for src in ("L['x'].size()[0]", "L['y'].size()[0]")]

    backends = {type(e.backend).__name__ for e in c_eval_frame._debug_get_cache_entry_list(add.__code__)}
    assert "_DynamoBackendKey" not in backends
