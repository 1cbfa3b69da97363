from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# Compiles in this process (profiles, inductor artifacts) must not see earlier runs'.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="stableguards-tests-")
atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_stableguards_state(tmp_path_factory, monkeypatch):
    """Every test starts with empty counters, explanations and warnings given, and a cache
    dir of its own (profiles, the key ledger, warm-start entries, torch's artifacts), so what
    it sees never depends on which tests ran before it.  A test may point the cache dir
    elsewhere (``monkeypatch.setenv``); a subprocess inherits the test's."""
    import stableguards

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    stableguards.reset()


_POPEN_INIT = subprocess.Popen.__init__


@functools.cache
def _cpu_probe() -> list[tuple[str, str]]:
    """Inductor's probe of this CPU's vector ISA (``pick_vec_isa``: test programs compiled
    and loaded, about 6 s in a new cache dir), made once per test process in a cache dir of
    its own: (path relative to it, absolute path) of each file it wrote; none if it failed."""
    probe = tempfile.mkdtemp(prefix="stableguards-cpu-probe-")
    atexit.register(shutil.rmtree, probe, ignore_errors=True)
    code = "from torch._inductor.cpu_vec_isa import pick_vec_isa; pick_vec_isa()"
    proc = subprocess.Popen.__new__(subprocess.Popen)
    _POPEN_INIT(proc, [sys.executable, "-c", code], env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": probe},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if proc.wait() != 0:
        return []
    return [(os.path.relpath(os.path.join(root, name), probe), os.path.join(root, name))
            for root, _, names in os.walk(probe) for name in names]


@pytest.fixture(autouse=True, scope="session")
def probed_cpu_in_children_cache_dirs():
    """A child process's cache dir holds inductor's probe of the CPU, as a machine's cache dir
    does after its first compile: every cold child would otherwise probe again (about 6 s).
    Only the probe, and only files missing there: torch's caches and stableguards' start as
    the test made them.  For the whole session, so that a module's fixture's children have
    it too."""
    def seeded(self, args, *rest, env=None, **kwargs):
        cache = (os.environ if env is None else env).get("TORCHINDUCTOR_CACHE_DIR")
        if cache:
            for relative, source in _cpu_probe():
                target = os.path.join(cache, relative)
                if not os.path.exists(target):
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copy2(source, target)
        _POPEN_INIT(self, args, *rest, env=env, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", seeded)
        yield


# The files that take over a minute on 2 cores (`--durations=0`, torch 2.15), longest first.
# xdist hands each worker a whole file at a time, in collection order (dev.sh turns off its
# reordering by test count): starting with the longest lets the two workers finish together,
# where xdist's own order (by how many tests a file has) sent the longest late.  A file not
# named here only starts later; the order never changes what a test sees.
LONGEST_FIRST = ("test_warm_start.py", "test_shared_store.py", "test_warm_campaign.py", "test_restart.py",
                 "test_fail_open.py", "test_optimizer_campaign.py", "test_autograd_cache.py",
                 "test_real_models.py", "test_store_artifacts.py", "test_optimizer_guards.py",
                 "test_pgo_integration.py", "test_graph_params.py", "test_flag_never_breaks.py",
                 "test_optimizer_soundness.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))


@pytest.fixture(scope="session")
def processes():
    """A multiprocessing context for tests of concurrent writers: each process forked from one
    server process that imported stableguards and torch once.  Spawned, each would import
    them itself (seconds apiece), and eight writers would start seconds apart.  The server
    keeps the environment it started with: give a process what it needs as arguments."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["stableguards.storage", "stableguards.profiles.store"])
    return context


@pytest.fixture
def fresh_dynamo():
    """Dynamo with no cached frames before and after the test."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _start_redis(workdir):
    """A redis-server on a free loopback port: (its process, its URL); skips without one."""
    import socket
    import subprocess
    import time

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    pytest.importorskip("redis", reason="the redis client is not installed (pip install redis)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    return proc, f"redis://127.0.0.1:{port}/0"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free loopback port, for this test session only."""
    proc, url = _start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def redis_server(tmp_path):
    """A redis-server of this test's own, which the test may stop: (process, URL)."""
    proc, url = _start_redis(tmp_path)
    yield proc, url
    proc.kill()
    proc.wait(timeout=10)
