#!/usr/bin/env bash
# One entry point for a fresh machine: creates a virtual environment, installs
# torch explicitly first, then this project, then runs what you asked for.
#
#   ./dev.sh demo    the cross-restart demo: wall time from process start to the first step,
#                    cold, restarted and on a new machine, flag off vs on (bench/first_step.py;
#                    its table, and its PNG in bench/out/)
#   ./dev.sh test    the test suite, two files at a time (arguments after it go to pytest;
#                    -n 0 runs it in one process)
#   ./dev.sh bench   the micro-benchmarks (allocator, import time, profile I/O, backends, key ledger,
#                    optimizer steps, warm start, real models, a fleet of ranks; cudagraph checks on a
#                    CUDA machine)
#
#   --torch VERSION  (first argument after the command) runs against another torch:
#                    ./dev.sh test --torch 2.13.0
#
# The default is torch 2.15.0, what users run (warm start needs it); 2.14 and 2.15
# come from PyPI with their CUDA libraries (about 5 GB, about 70 s; they run on CPU),
# 2.13.0 as a small CPU wheel.  Each version gets its own .venv-torch-VERSION.
set -euo pipefail
cd "$(dirname "$0")"

TORCH_VERSION=2.15.0
COMMAND="${1:-}"
[ $# -gt 0 ] && shift
if [ "${1:-}" = "--torch" ]; then
    TORCH_VERSION="${2:?--torch needs a version, e.g. 2.15.0}"
    shift 2
fi
VENV=".venv-torch-$TORCH_VERSION"
PY="$VENV/bin/python"

setup() {
    [ -x "$PY" ] || "${PYTHON:-python3}" -m venv "$VENV"
    # Pin torch first: an unpinned torch would pull a multi-GB CUDA build.  Some
    # machines cap torch with a pip constraint file; the version is pinned by name,
    # so the cap is lifted for these installs only.
    PIP_CONSTRAINT=/dev/null "$PY" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
    PIP_CONSTRAINT=/dev/null "$PY" -m pip install -q --disable-pip-version-check -e ".[$1]"
}

case "$COMMAND" in
    demo)
        setup test,bench
        "$PY" bench/first_step.py "$@"
        ;;
    test)
        setup test
        echo "torch $("$PY" -c 'import torch; print(torch.__version__)')"
        # Two workers, each file on one (its fixtures and its fresh processes kept together):
        # most tests wait on compiles in child processes, so two at a time on two cores.  Files
        # go out longest first (tests/conftest.py), not reordered by how many tests each has.
        "$PY" -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
        ;;
    bench)
        setup test,bench
        for script in alloc_cost import_time pgo_io backend_switch optimizer_table optimizer_guard_check \
                      optimizer_rebuild cudagraph_static backend_call_cost key_ledger restart_ab warm_start \
                      warm_step_cost real_models fleet distributed; do
            "$PY" "bench/$script.py"
        done
        ;;
    *)
        echo "usage: ./dev.sh demo|test|bench [--torch VERSION] [arguments]" >&2
        exit 2
        ;;
esac
