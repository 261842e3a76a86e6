"""A compromised actor that signals other processes of its app, and the app it runs in
(``python -m tests.sandbox_actors [--drop CAP ...]``, from the repository's root): what
tests/test_sandbox.py runs in a process of its own, so that a signal the kernel lets through
ends that app, never the test run, and so that the app can run without capabilities.

The app prints one line, ``RESULT`` and a JSON object: what each signal sent got (the errno's
name, or ``sent``), and whether its targets are unharmed afterwards."""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import signal
import time
from typing import Any

import otpmesh

#: What the actor sends, in this order (harmless first, so a kernel that lets them through shows
#: it before the harmful ones end the app).
SIGNALS = ("SIGCONT", "SIGSTOP", "SIGKILL")
CAPS = {"cap_kill": 5, "cap_sys_admin": 21}
_PR_CAPBSET_DROP = 24
_CAPABILITY_VERSION_3 = 0x20080522


def _outcome(send: Any) -> str:
    try:
        send()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "sent"


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def state(pid: int) -> str:
    """The process's state letter (``T``: stopped), or ``gone``."""
    try:
        return _status(pid)["State"].split()[0]
    except (OSError, KeyError):
        return "gone"


class Attacker(otpmesh.Actor):
    """User code gone bad: it signals whatever pid it is given."""

    @otpmesh.endpoint
    def whoami(self) -> dict[str, Any]:
        status = _status(os.getpid())
        caps = int(status["CapEff"], 16)
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "caps": {name: bool(caps >> bit & 1) for name, bit in CAPS.items()},
            "no_new_privs": status.get("NoNewPrivs") == "1",
        }

    @otpmesh.endpoint
    def send(self, pid: int, name: str) -> dict[str, str]:
        """`name` to `pid` with kill(2) and with pidfd_send_signal(2). A SIGSTOP that goes
        through is undone at once, so that the app goes on to report it."""
        sig = signal.Signals[name]
        got = {"kill": _outcome(lambda: os.kill(pid, sig))}
        if got["kill"] == "sent" and sig == signal.SIGSTOP:
            os.kill(pid, signal.SIGCONT)
        pidfd = os.pidfd_open(pid)
        try:
            got["pidfd"] = _outcome(lambda: signal.pidfd_send_signal(pidfd, sig))
        finally:
            os.close(pidfd)
        if got["pidfd"] == "sent" and sig == signal.SIGSTOP:
            os.kill(pid, signal.SIGCONT)
        return got

    @otpmesh.endpoint
    def signal_own(self) -> dict[str, str]:
        """What it may still signal: itself and a child it forks."""
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        try:
            return {
                "self": _outcome(lambda: os.kill(os.getpid(), signal.SIGCONT)),
                "own child": _outcome(lambda: os.kill(child, signal.SIGKILL)),
            }
        finally:
            os.waitpid(child, 0)


def drop_capabilities(names: list[str]) -> None:
    """Drop `names` from this process's bounding set (so that no program it runs, the fork
    server included, gets them back) and from its effective, permitted and inheritable sets."""
    libc = ctypes.CDLL(None, use_errno=True)
    caps = [CAPS[n] for n in names]
    for cap in caps:
        if libc.prctl(_PR_CAPBSET_DROP, *map(ctypes.c_ulong, (cap, 0, 0, 0))) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")

    class Header(ctypes.Structure):
        _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))

    class Data(ctypes.Structure):
        _fields_ = (
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        )

    header, data = Header(_CAPABILITY_VERSION_3, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for cap in caps:
        word, bit = divmod(cap, 32)
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[word], field, getattr(data[word], field) & ~(1 << bit))
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


async def attack(signals: list[str]) -> dict[str, Any]:
    """An attacker in one mesh, a victim in another: the attacker signals the controller, its
    fork server and the victim; then each is checked."""
    attackers = await otpmesh.proc_mesh(procs=1)
    attacker = (await attackers.spawn("attacker", Attacker))[0]
    victims = await otpmesh.proc_mesh(procs=1)
    victim = (await victims.spawn("victim", Attacker))[0]
    me, them = await attacker.whoami(), await victim.whoami()
    targets = {"controller": os.getpid(), "fork server": me["ppid"], "sibling": them["pid"]}
    sent = {
        f"{target} {name}": await attacker.send(pid, name)
        for target, pid in targets.items()
        for name in signals
    }
    states = {target: state(pid) for target, pid in targets.items()}
    again = await victim.whoami()  # the sibling answers, as the same process
    fresh = await otpmesh.proc_mesh(procs=1)  # the fork server still forks
    third = (await fresh.spawn("third", Attacker))[0]
    return {
        "attacker": me,
        "sent": sent,
        "states": states,
        "sibling answers": again["pid"] == them["pid"],
        "fork server forks": (await third.whoami())["ppid"] == me["ppid"],
        "own": await attacker.signal_own(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.sandbox_actors")
    parser.add_argument("--drop", nargs="*", default=[], choices=sorted(CAPS))
    parser.add_argument("--signals", nargs="*", default=list(SIGNALS), choices=SIGNALS)
    args = parser.parse_args()
    if args.drop and os.getuid() == 0:
        drop_capabilities(args.drop)
    print("RESULT", json.dumps(otpmesh.run(attack, args.signals)), flush=True)


if __name__ == "__main__":
    main()
