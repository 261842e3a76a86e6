"""Spike: kill -> robust-futex wake vs kill -> socket EOF vs kill -> pidfd readable.

Not product code. A parent that has imported torch (and touched BALLAST_MB) forks a child; the
child takes a PTHREAD_MUTEX_ROBUST|PTHREAD_PROCESS_SHARED mutex in a shared memfd mapping; the
parent has one thread blocked in pthread_mutex_lock (-> EOWNERDEAD), one in poll on the socket,
one in poll on the pidfd. Medians of N kills, all three measured in the same kills.
"""

import ctypes
import mmap
import os
import select
import signal
import socket
import statistics
import sys
import threading
import time

N = int(os.environ.get("N", "30"))
BALLAST_MB = int(os.environ.get("BALLAST_MB", "0"))
if os.environ.get("TORCH", "1") == "1":
    import torch  # noqa: F401

    torch.ones(1000).sum()
ballast = bytearray(BALLAST_MB << 20)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1

libc = ctypes.CDLL(None, use_errno=True)
MUTEX_SIZE = 64  # >= sizeof(pthread_mutex_t) on x86_64 (40) and aarch64 (48)
ATTR_SIZE = 8
PTHREAD_PROCESS_SHARED = 1
PTHREAD_MUTEX_ROBUST = 1
EOWNERDEAD = 130


def make_mutex():
    fd = os.memfd_create("dw", 0)
    os.ftruncate(fd, 4096)
    mm = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
    os.close(fd)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    attr = ctypes.create_string_buffer(ATTR_SIZE * 4)
    assert libc.pthread_mutexattr_init(attr) == 0
    assert libc.pthread_mutexattr_setpshared(attr, PTHREAD_PROCESS_SHARED) == 0
    assert libc.pthread_mutexattr_setrobust(attr, PTHREAD_MUTEX_ROBUST) == 0
    assert libc.pthread_mutex_init(ctypes.c_void_p(addr), attr) == 0
    return mm, addr


def one(mm, addr):
    a, b = socket.socketpair()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        a.close()
        os.close(r)
        rc = libc.pthread_mutex_lock(ctypes.c_void_p(addr))
        os.write(w, bytes([rc]))
        while True:
            time.sleep(100)
    b.close()
    os.close(w)
    assert os.read(r, 1) == b"\x00"
    os.close(r)
    pidfd = os.pidfd_open(pid)
    t = {}
    ready = threading.Barrier(4)

    def futex():
        ready.wait()
        rc = libc.pthread_mutex_lock(ctypes.c_void_p(addr))
        t["futex"] = time.monotonic()
        t["rc"] = rc
        if rc == EOWNERDEAD:
            libc.pthread_mutex_consistent(ctypes.c_void_p(addr))
        libc.pthread_mutex_unlock(ctypes.c_void_p(addr))

    def waitfd(name, fd):
        ready.wait()
        p = select.poll()
        p.register(fd, select.POLLIN)
        p.poll()
        t[name] = time.monotonic()

    ths = [
        threading.Thread(target=futex),
        threading.Thread(target=waitfd, args=("eof", a.fileno())),
        threading.Thread(target=waitfd, args=("pidfd", pidfd)),
    ]
    for th in ths:
        th.start()
    ready.wait()
    time.sleep(0.05)  # let the futex waiter block (sets FUTEX_WAITERS)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for th in ths:
        th.join()
    os.waitpid(pid, 0)
    os.close(pidfd)
    a.close()
    assert t["rc"] == EOWNERDEAD, t["rc"]
    return {k: (t[k] - t0) * 1e3 for k in ("futex", "eof", "pidfd")}


def main():
    mm, addr = make_mutex()
    rows = [one(mm, addr) for _ in range(N)]
    for k in ("futex", "eof", "pidfd"):
        xs = [r[k] for r in rows]
        print(f"{k:6s} p50 {statistics.median(xs):7.3f} ms  min {min(xs):7.3f}  max {max(xs):7.3f}")
    lead = [r["eof"] - r["futex"] for r in rows]
    print(f"eof - futex per kill: p50 {statistics.median(lead):7.3f} ms  min {min(lead):7.3f}")
    first = sum(1 for r in rows if r["futex"] < r["eof"] and r["futex"] < r["pidfd"])
    print(f"futex first in {first}/{N}; torch={'torch' in sys.modules} ballast={BALLAST_MB}MB;"
          f" load {os.getloadavg()}")


main()
