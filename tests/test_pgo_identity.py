"""Stable identities: closure fingerprints and the default profile key."""

from __future__ import annotations

import sys
import types

from stableguards.profiles.identity import closure_fingerprint, default_profile_key


def make(helper):
    def inner(x):
        return helper(x)

    return inner


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def test_closures_are_told_apart_by_the_functions_they_close_over():
    assert closure_fingerprint(make(double).__closure__) == closure_fingerprint(make(double).__closure__)
    assert closure_fingerprint(make(double).__closure__) != closure_fingerprint(make(triple).__closure__)


def test_other_captured_values_are_not_identity():
    assert closure_fingerprint(make(1).__closure__) == closure_fingerprint(make(2).__closure__)


def _main_with(monkeypatch, argv, spec_name=None):
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", argv)


def test_default_key_of_a_script_ignores_its_arguments(monkeypatch):
    _main_with(monkeypatch, ["/jobs/train.py", "--lr", "0.1"])
    first = default_profile_key()
    _main_with(monkeypatch, ["/jobs/train.py", "--lr", "0.2"])
    assert default_profile_key() == first and first.startswith("train-")
    _main_with(monkeypatch, ["/other/train.py"])
    assert default_profile_key() != first


def test_default_key_of_a_module_names_the_module(monkeypatch):
    _main_with(monkeypatch, ["/site/pkg/train.py"], spec_name="pkg.train")
    assert default_profile_key().startswith("pkg.train-")


def test_default_key_of_an_interactive_session(monkeypatch):
    _main_with(monkeypatch, ["-c"])
    assert default_profile_key().startswith("interactive-")


def test_default_key_of_a_module_or_session_separates_projects(monkeypatch, tmp_path):
    keys = set()
    for project in ("alpha", "beta"):
        root = tmp_path / project
        (root / "src" / "deep").mkdir(parents=True)
        (root / "pyproject.toml").write_text("")
        for cwd in (root, root / "src" / "deep"):  # anywhere inside the project: one key
            monkeypatch.chdir(cwd)
            _main_with(monkeypatch, ["/site/pytest/__main__.py"], spec_name="pytest")
            module_key = default_profile_key()
            _main_with(monkeypatch, ["-c"])
            keys.add((project, module_key, default_profile_key()))
    assert len(keys) == 2  # one (module, interactive) pair per project
    (alpha_module, alpha_session), (beta_module, beta_session) = [k[1:] for k in sorted(keys)]
    assert alpha_module != beta_module and alpha_session != beta_session
    assert alpha_module.startswith("pytest-") and alpha_session.startswith("interactive-")


def test_project_root_is_the_nearest_directory_with_a_marker(tmp_path):
    from stableguards.profiles.identity import project_root

    start = tmp_path / "repo" / "a" / "b"
    start.mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()
    assert project_root(str(start)) == str(tmp_path / "repo")
