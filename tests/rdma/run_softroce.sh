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
#
# A hang must say where it is (issue 42: a guest sat idle after "collecting ..." until it was
# ended, with nothing to show where). In the guest:
# - a watchdog prints, every 5 minutes, pytest's state, CPU time and the kernel function it
#   waits in (a hang: the same wait, its CPU time still); nothing times collection otherwise
#   (plugins, conftests, test modules, torch, the device probe), and each test has
#   pytest-timeout's limit, which writes the threads' stacks itself. Not faulthandler's
#   dump_traceback_later: reading a running thread's frames from another one can crash it
#   (seen here: a SIGSEGV in a slow but live collection in the guest).
# - a few minutes before the runner's --timeout (SOFTROCE_TIMEOUT) would end the guest, the
#   watchdog lists every guest process with its state and wait (ps wchan, /proc/PID/stack,
#   SysRq-w into dmesg), sends SIGABRT to pytest (faulthandler, enabled from before pytest is
#   imported on a copy of the real stderr, writes every thread's stack), kills it, and the
#   command ends with 124: the runner reports the hang, and the log of where it was reaches
#   the host.
# - stdin is /dev/null (the guest's own is its serial console: a read there never returns); no
#   cache provider, hypothesis's database on the /var/tmp tmpfs, no bytecode prefix from a
#   host shell: nothing writes, or locks, a file on the read-only 9p root (where the kernel
#   makes a flock a POSIX lock owned by the open file, so a flock and a lockf of one file
#   conflict; in the guest, a flock then a lockf of one file by one process never returned).
limit=${SOFTROCE_TIMEOUT:-2700}
GUEST_PYTEST='import faulthandler, os, sys
faulthandler.enable(os.fdopen(os.dup(2), "w"), all_threads=True)  # pytest captures fd 2
import pytest
sys.exit(pytest.main(sys.argv[1:]))'
# shellcheck disable=SC2016 # the guest's script expands its own variables
"$SOFTROCE" --timeout "$limit" -- \
  env OTPMESH_IBVERBS_TEST_TORCH="${OTPMESH_IBVERBS_TEST_TORCH:-0}" \
  OTPMESH_TEST_SLOWDOWN="${OTPMESH_TEST_SLOWDOWN:-}" \
  OTPMESH_GUEST_DEADLINE=$((start + limit - 180)) OTPMESH_GUEST_LIMIT=$((limit - 180)) \
  OTPMESH_GUEST_BEAT_S="${OTPMESH_GUEST_BEAT_S:-300}" \
  HYPOTHESIS_STORAGE_DIRECTORY=/var/tmp/hypothesis bash -c '
  unset PYTHONPYCACHEPREFIX
  py=$0 boot=$1; shift
  d=$(mktemp -d) && ln -s /usr/lib/python3/dist-packages/pyverbs "$d/pyverbs"
  export PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}"
  echo "run_softroce: guest kernel $(uname -r), $(nproc) CPUs, $(dmesg | grep -m1 -o "crng init done" || echo "no crng init line")"
  if [ -z "$OTPMESH_TEST_SLOWDOWN" ]; then
    s=$(date +%s%N); "$py" -c "import trio, msgpack" </dev/null; ms=$((($(date +%s%N) - s) / 1000000))
    OTPMESH_TEST_SLOWDOWN=$(((ms + 9999) / 10000))
    echo "run_softroce: a fresh interpreter imported trio in $ms ms: deadlines x$OTPMESH_TEST_SLOWDOWN"
  fi
  export OTPMESH_TEST_SLOWDOWN
  # Until 3 minutes before the runner ends the guest (the host clock; at most that long by the
  # guest clock, should the two disagree), and at least a minute.
  wait_s=$((OTPMESH_GUEST_DEADLINE - $(date +%s)))
  [ $wait_s -le $OTPMESH_GUEST_LIMIT ] || wait_s=$OTPMESH_GUEST_LIMIT
  [ $wait_s -ge 60 ] || wait_s=60
  (
    trap "kill \$! 2>/dev/null; exit 0" TERM
    pytest_pid() { for c in $(pgrep -P $$); do [ "$(cat /proc/$c/comm)" = bash ] || echo $c; done; }
    end=$(($(date +%s) + wait_s))
    while left=$((end - $(date +%s))) && [ $left -gt 0 ]; do
      [ $left -le $OTPMESH_GUEST_BEAT_S ] || left=$OTPMESH_GUEST_BEAT_S
      sleep $left & wait $!
      pid=$(pytest_pid)
      [ -z "$pid" ] || echo "run_softroce: $(date +%T) pytest: $(ps -o stat=,time=,wchan:32= -p $pid 2>&1), guest load $(cut -d" " -f1-3 /proc/loadavg)"
    done
    pid=$(pytest_pid); [ -n "$pid" ] || exit 0
    touch "$d/hung"
    echo "--- run_softroce: pytest (pid $pid) still running after $wait_s s; guest processes:"
    ps -eo pid,ppid,stat,wchan:32,time,etime,args | cut -c1-200
    for c in $(pgrep -f python); do echo "--- kernel stack of $c:"; cat /proc/$c/stack; done
    echo w > /proc/sysrq-trigger; echo "--- dmesg:"; dmesg | tail -150
    echo "--- run_softroce: SIGABRT to pytest: its threads stacks follow"
    kill -ABRT $pid; sleep 20; kill -KILL $pid 2>/dev/null
  ) & dog=$!
  status=0
  "$py" -c "$boot" -p no:cacheprovider "$@" </dev/null || status=$?
  kill $dog 2>/dev/null; wait $dog
  if [ -e "$d/hung" ]; then
    echo "run_softroce: pytest did not finish in $wait_s s: a hang (exit 124)"; exit 124
  fi
  [ $status -ne 0 ] || exit 0
  echo "--- guest dmesg (rxe / rdma / hung):"; dmesg | grep -iE "rxe|rdma|ib_|hung|blocked" | tail -40
  exit $status' "$PY" "$GUEST_PYTEST" "$@" || status=$?
echo "run_softroce: exit $status after $(($(date +%s) - start)) s (guest boot included)"
exit "$status"
