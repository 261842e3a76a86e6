"""A compromised actor cannot read its controller's memory (docs/security.md): the controller is
not dumpable, so ``/proc/PID/mem``, ``process_vm_readv`` and ``pidfd_getfd`` on it are refused;
nor a sibling worker's, each worker being a sandbox of its own (``OTPMESH_SANDBOX=0``: it can);
and the tensor channel still moves tensors both ways through shared memory (snapshot files
passed over the connection, the controller copying for its readers: docs/rdma.md).

The whole app runs as an unprivileged user: root reads any process (``CAP_SYS_PTRACE``), so a
root app would show nothing. Real processes, real syscalls."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import otpmesh

NOBODY = 65534

APP = textwrap.dedent(
    r"""
    import ctypes, errno, json, os

    import torch

    import otpmesh
    from otpmesh.rdma import RDMABuffer

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    SYS_PIDFD_GETFD = 438


    class IoVec(ctypes.Structure):
        _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


    def outcome(fn):
        try:
            fn()
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))
        return "read"


    def probe(pid, address, size):
        # What a compromised actor would try on process `pid`, at `address` (`size` bytes).
        def mem():
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
                f.seek(address)
                if len(f.read(size)) != size:
                    raise OSError(errno.EIO, "short read")

        def vm_readv():
            out = ctypes.create_string_buffer(size)
            here = IoVec(ctypes.addressof(out), size)
            there = IoVec(address, size)
            if libc.process_vm_readv(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0) < 0:
                raise OSError(ctypes.get_errno(), "process_vm_readv")

        def getfd():
            pidfd = os.pidfd_open(pid)
            try:
                fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, 0, 0)
                if fd < 0:
                    raise OSError(ctypes.get_errno(), "pidfd_getfd")
                os.close(fd)
            finally:
                os.close(pidfd)

        return {"mem": outcome(mem), "vm_readv": outcome(vm_readv), "getfd": outcome(getfd)}


    class Prober(otpmesh.Actor):
        def __init__(self):
            self.held = ctypes.create_string_buffer(b"a sibling's bytes", 64)

        @otpmesh.endpoint
        def where(self):
            return os.getpid(), ctypes.addressof(self.held)

        @otpmesh.endpoint
        def probe(self, pid, address, size):
            return probe(pid, address, size)

        @otpmesh.endpoint
        def echo(self, value):
            return value

        @otpmesh.endpoint
        async def bump(self, buf):
            local = torch.empty(buf.nbytes, dtype=torch.uint8)
            await buf.read_into(local)
            local += 1
            await buf.write_from(local)
            return buf.backend


    async def main():
        secret = ctypes.create_string_buffer(b"held only by the controller", 64)
        procs = await otpmesh.proc_mesh(procs=2)
        probers = await procs.spawn("probers", Prober)
        result = {
            "uid": os.getuid(),
            "controller": await probers[0].probe(os.getpid(), ctypes.addressof(secret), 27),
        }
        sibling_pid, sibling_at = await probers[1].where()
        result["sibling"] = await probers[0].probe(sibling_pid, sibling_at, 17)
        own_pid, own_at = await probers[0].where()
        result["self"] = await probers[0].probe(own_pid, own_at, 17)
        big = torch.arange(64 << 20, dtype=torch.int32).mul_(-1640531535)  # 256 MiB
        result["big"] = bool(torch.equal(await probers[0].echo(big), big))
        small = torch.arange(1 << 20, dtype=torch.int32).mul_(7)  # 4 MiB: copied, not mapped
        result["small"] = bool(torch.equal(await probers[0].echo(small), small))
        weights = torch.zeros(8 << 20, dtype=torch.uint8)
        result["bump_backend"] = await probers[0].bump(RDMABuffer(weights))
        result["bumped"] = bool((weights == 1).all())
        await procs.stop()
        print("RESULT", json.dumps(result))


    if __name__ == "__main__":
        otpmesh.run(main)
    """
)


def _run_as_nobody(extra_env: dict[str, str]) -> dict[str, object]:
    if os.getuid() != 0:
        pytest.skip("needs root to run the app as another, unprivileged user (uid 65534)")
    # The app's interpreter must be reachable by that user: the test run's may live under
    # root's home (pyenv); a system Python of the same version loads the same packages.
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = next((p for p in (sys.executable, f"/usr/bin/{version}") if _runs_as_nobody(p)), None)
    if python is None:
        pytest.skip(f"no {version} interpreter that uid {NOBODY} can run and import torch with")
    # Not pytest's tmp_path: it lies in a directory only root may enter.
    with tempfile.TemporaryDirectory(prefix="otpmesh-undumpable-") as where:
        home = Path(where)
        home.chmod(0o777)
        program = home / "app.py"
        program.write_text(APP)
        done = subprocess.run(
            [python, str(program)],
            capture_output=True,
            text=True,
            timeout=240,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            cwd=home,
            env={**_env(home), **extra_env},
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    found: dict[str, object] = json.loads(lines[-1].removeprefix("RESULT "))
    return found


def _env(home: Path) -> dict[str, str]:
    package_root = str(Path(otpmesh.__file__).resolve().parent.parent)
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONPATH": os.pathsep.join([package_root, *site.getsitepackages()]),
        "OTPMESH_RDMA_BACKENDS": "shm",  # no fallback to tcp could hide a refused copy
    }


def _runs_as_nobody(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import torch, trio, msgpack, otpmesh"],
            capture_output=True,
            timeout=60,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            cwd="/",
            env=_env(Path("/tmp")),
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@pytest.mark.timeout(300)
def test_an_actor_cannot_read_its_controller_and_the_channel_still_moves_tensors() -> None:
    result = _run_as_nobody({})
    assert result["uid"] == NOBODY
    # The controller's memory: every way a process of the same user reads another is refused.
    controller = result["controller"]
    assert isinstance(controller, dict)
    assert controller["mem"] in ("EACCES", "EPERM"), controller
    assert controller["vm_readv"] == "EPERM", controller
    assert controller["getfd"] == "EPERM", controller
    # A sibling worker is refused too: each worker is a sandbox of its own (docs/security.md).
    # The same probes read the actor's own process, so the refusals are not a broken probe.
    sibling = result["sibling"]
    assert isinstance(sibling, dict)
    assert sibling["mem"] in ("EACCES", "EPERM"), sibling
    assert sibling["vm_readv"] == "EPERM" and sibling["getfd"] == "EPERM", sibling
    assert result["self"] == {"mem": "read", "vm_readv": "read", "getfd": "read"}
    # The channel: 256 MiB controller -> worker and back (mapped), 4 MiB (copied), and a
    # controller-registered RDMABuffer read and written by the worker over shm.
    assert result["big"] is True
    assert result["small"] is True
    assert result["bump_backend"] == "shm"
    assert result["bumped"] is True


@pytest.mark.timeout(300)
def test_unsandboxed_workers_read_each_other_but_not_the_controller() -> None:
    # OTPMESH_SANDBOX=0: workers stay dumpable and outside any sandbox (docs/security.md).
    result = _run_as_nobody({"OTPMESH_SANDBOX": "0"})
    controller = result["controller"]
    assert isinstance(controller, dict)
    assert controller["vm_readv"] == "EPERM" and controller["getfd"] == "EPERM", controller
    assert result["sibling"] == {"mem": "read", "vm_readv": "read", "getfd": "read"}
    assert result["big"] is True and result["small"] is True
    assert result["bump_backend"] == "shm" and result["bumped"] is True


@pytest.mark.timeout(300)
def test_isolated_workers_cannot_read_each_other_and_the_channel_falls_back() -> None:
    # OTPMESH_DUMPABLE=0 (untrusted actor code): no process of the app is readable.
    result = _run_as_nobody({"OTPMESH_DUMPABLE": "0", "OTPMESH_RDMA_BACKENDS": "shm,tcp"})
    for target in ("controller", "sibling"):
        probes = result[target]
        assert isinstance(probes, dict)
        assert probes["mem"] in ("EACCES", "EPERM"), (target, probes)
        assert probes["vm_readv"] == "EPERM" and probes["getfd"] == "EPERM", (target, probes)
    # Large values are still mapped from descriptors; an RDMABuffer falls back to tcp.
    assert result["big"] is True and result["small"] is True
    assert result["bump_backend"] == "tcp" and result["bumped"] is True
