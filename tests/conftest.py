from __future__ import annotations

import atexit
import os
import shutil
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
