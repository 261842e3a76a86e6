#!/bin/bash
# Run the ibverbs tests on a real (software) RDMA device: soft-RoCE rxe0 inside a QEMU guest
# (../shared/tools/softroce, see its README). Boot 20-40 s; the whole default run takes minutes
# because the guest's CPUs are emulated.
#
#   tests/rdma/run_softroce.sh                      # -m ibverbs tests/rdma/test_ibverbs.py
#   tests/rdma/run_softroce.sh -m ibverbs tests/rdma  # any pytest arguments instead
#
# PYTHON (default .venv/bin/python) must be a CPython 3.11, the version Debian's python3-pyverbs
# is built for. Only the pyverbs package is put on its path: the whole of
# /usr/lib/python3/dist-packages would shadow the venv's own packages (setuptools, pip, ...).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SOFTROCE=${SOFTROCE:-$ROOT/../shared/tools/softroce/run}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ $# -gt 0 ] || set -- -v -m ibverbs tests/rdma/test_ibverbs.py
cd "$ROOT"
start=$(date +%s)
status=0
# The guest does not inherit this environment: pass what the tests read explicitly. Importing
# torch over the guest's 9p filesystem takes minutes, so its test is opt-in here.
# The guest's CPUs are emulated: on a busy host a fresh interpreter there takes minutes to import
# torch (measured: 270 s at load 18, against the tests' 150 s deadlines). So the guest first
# times one fresh interpreter importing trio and msgpack, and the tests' deadlines are
# multiplied by one per 10 s it took (OTPMESH_TEST_SLOWDOWN, tests/conftest.py): a slow run is
# long, never wrong. Set OTPMESH_TEST_SLOWDOWN to choose the factor instead.
"$SOFTROCE" --timeout "${SOFTROCE_TIMEOUT:-2700}" -- \
  env OTPMESH_IBVERBS_TEST_TORCH="${OTPMESH_IBVERBS_TEST_TORCH:-0}" \
  OTPMESH_TEST_SLOWDOWN="${OTPMESH_TEST_SLOWDOWN:-}" bash -c '
  d=$(mktemp -d) && ln -s /usr/lib/python3/dist-packages/pyverbs "$d/pyverbs"
  export PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}"
  if [ -z "$OTPMESH_TEST_SLOWDOWN" ]; then
    s=$(date +%s%N); "$0" -c "import trio, msgpack"; ms=$((($(date +%s%N) - s) / 1000000))
    OTPMESH_TEST_SLOWDOWN=$(((ms + 9999) / 10000))
    echo "run_softroce: a fresh interpreter imported trio in $ms ms: deadlines x$OTPMESH_TEST_SLOWDOWN"
  fi
  export OTPMESH_TEST_SLOWDOWN
  "$0" -m pytest -p no:cacheprovider "$@" && exit 0
  status=$?; echo "--- guest dmesg (rxe / rdma / hung):"; dmesg | grep -iE "rxe|rdma|ib_|hung|blocked" | tail -40; exit $status' "$PY" "$@" || status=$?
echo "run_softroce: exit $status after $(($(date +%s) - start)) s (guest boot included)"
exit "$status"
