#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv, installs torch 2.13.0
# (CPU) explicitly first, then this project, then runs what you asked for.
#
#   ./dev.sh demo    cross-restart A/B demo: prints the table, writes bench/out/
#   ./dev.sh test    the test suite
#   ./dev.sh bench   the micro-benchmarks (allocator, import time, profile I/O, backends, key ledger,
#                    optimizer steps; cudagraph checks on a CUDA machine)
set -euo pipefail
cd "$(dirname "$0")"

setup() {
    [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
    # Pin torch first: an unpinned torch would pull a multi-GB CUDA build.
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$1]"
}

case "${1:-}" in
    demo)
        setup test,bench
        .venv/bin/python bench/restart_ab.py
        ;;
    test)
        setup test
        shift
        .venv/bin/python -m pytest "$@"
        ;;
    bench)
        setup test,bench
        .venv/bin/python bench/alloc_cost.py
        .venv/bin/python bench/import_time.py
        .venv/bin/python bench/pgo_io.py
        .venv/bin/python bench/backend_switch.py
        .venv/bin/python bench/optimizer_table.py
        .venv/bin/python bench/optimizer_guard_check.py
        .venv/bin/python bench/optimizer_rebuild.py
        .venv/bin/python bench/cudagraph_static.py
        .venv/bin/python bench/backend_call_cost.py
        .venv/bin/python bench/key_ledger.py
        ;;
    *)
        echo "usage: ./dev.sh demo|test|bench" >&2
        exit 2
        ;;
esac
