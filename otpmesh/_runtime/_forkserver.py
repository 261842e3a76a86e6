"""The pre-warmed fork server: worker processes are forked from it, not started from scratch.

It is started once per controller with a fresh interpreter, imports the heavy modules (trio,
msgpack, otpmesh, torch when installed) and then forks a worker per request, so a mesh starts in
milliseconds. It never initialises CUDA, so a forked child can. It watches its children with
SIGCHLD and reports each exit status, and it is the controller's insurance against orphans: when
the controller's socket closes, it SIGKILLs every child and exits. With a takeover set up
(_forkstandby.py) it first waits the grace period for a standby controller to attach instead.

Requests and reports are msgpack packets on a SOCK_SEQPACKET socket pair; a spawn request carries
the child's stdout, stderr, beat and control pipe ends as SCM_RIGHTS file descriptors. Every child
(a spare too) is forked holding its death lock (_deathlock.py) in a page made here for it; the
"spawned" report hands that page to the controller, which watches it (read-only) from then on.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import select
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

import msgpack

from .._core._sandbox import confine_worker
from . import _deathlock
from ._exitfuncs import disown_finalizers, run_exit_functions
from ._forkstandby import ControllerLink, Standby
from ._liveness import describe_status
from ._spare import SparePool, template

_PR_SET_PDEATHSIG = 1
_MAX_PACKET = 1 << 20


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(
    sock: socket.socket,
    wake_r: int,
    wake_w: int,
    req: dict[str, Any],
    fds: list[int],
    server_pid: int,
    standby: Standby | None,
    server_fds: list[int],
    page: int | None = None,
) -> None:
    code = 1
    started = False
    try:
        disown_finalizers()  # the server's objects' finalizers are not this worker's
        # A session of its own, so a scheduling group (autogroup) of its own: CPU is shared
        # between groups first. In the server's, every worker shared one group's share, and a
        # restarting worker got a sliver of it beside busy siblings' threads (issue 26).
        os.setsid()
        sock.close()
        if standby is not None:
            standby.close_fds()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (wake_r, wake_w, *server_fds):
            os.close(fd)
        if fds:  # a spare (_spare.py) is given its pipes and environment with its process
            out, err, heartbeat, control = fds
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.close(out)
            os.close(err)
            req["cfg"]["heartbeat_fd"] = heartbeat
            req["cfg"]["control_fd"] = control
        set_parent_death_signal()
        if os.getppid() != server_pid:
            os._exit(1)
        if page is not None:  # held by this (main) thread until the process exits
            try:
                _deathlock.hold(page)
            except OSError as exc:  # its HELLO says so: it is watched by its EOF alone
                print(f"otpmesh worker: no death lock: {exc}", file=sys.stderr)
        os.environ.update(req["env"])
        try:  # a Landlock domain of its own (its slot's OTPMESH_SANDBOX): it signals only itself
            confine_worker()  # and what it forks. Now, while this is its only thread.
        except OSError as exc:  # the kernel has the scope yet refused: said, and it runs on
            print(f"otpmesh worker: not sandboxed: {exc}", file=sys.stderr)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        from ._worker import main

        started = True
        code = main(req["cfg"])
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            if started:  # it ran and ended in order (or raised): exit as a Python program does
                run_exit_functions(code)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _preloaded() -> None:
    """Keep what the workers inherit shared with them (docs/architecture.md, "What a worker
    costs"). A forked child shares the server's pages until it writes to them, and a full
    collection in the child writes to every object the server made (the collector's links live
    in each object's header): measured, an idle worker's private memory went from 9 MB to 49 MB
    at its first full collection. Frozen objects are never walked, so those pages stay shared.

    The preload ran without the collector: importing torch and torch._dynamo ran 715
    collections, 17% of the import's time, and the start of every app waits for it. What they
    would have found, about 10,000 objects of import-time garbage (a few MB), stays frozen in the
    server and shared with its workers rather than costing a full collection here (0.9 to 2 s
    under load)."""
    gc.freeze()
    gc.enable()


def serve(sock: socket.socket, preload: list[str]) -> None:
    """Fork workers on request until the controller's socket closes (with a takeover set up:
    until no controller took the children over within the grace period)."""
    # No collections while preloading, then every object frozen: see _preloaded.
    gc.disable()
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing optional module must not stop the server
            print(f"otpmesh fork server: cannot preload {name}: {exc}", file=sys.stderr)
    _preloaded()
    # No parent-death signal here: Linux sends it when the parent *thread* exits, and the
    # controller starts this process from one of trio's worker threads, which retire when idle.
    # The controller's socket closing (below) is what ends this server, SIGKILL included.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: set[int] = set()
    server_pid = os.getpid()
    link = ControllerLink(sock)
    standby: Standby | None = None

    def fork_spare(cfg: dict[str, Any]) -> tuple[int, socket.socket, int | None]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        page = _new_page()
        pid = os.fork()
        if pid == 0:
            ours.close()
            req = {"env": {}, "cfg": dict(cfg, spare_fd=theirs.fileno())}
            assert link.sock is not None  # a spare is asked for by the controller linked now
            _child(link.sock, wake_r, wake_w, req, [], server_pid, standby, spares.fds(), page)
        theirs.close()
        children.add(pid)
        return pid, ours, page

    spares = SparePool(fork_spare)
    link.send({"op": "ready", "pid": server_pid})
    try:
        while True:
            timeout = standby.left() if standby is not None and link.sock is None else None
            if timeout is not None and timeout <= 0:
                return  # nobody took the children over within the grace period
            if standby is not None:
                for conn in standby.expire():
                    sel.unregister(conn)
                _serve_listener(sel, standby)
                due = standby.next_due()
                if due is not None:
                    timeout = due if timeout is None else min(timeout, due)
            for key, _ in sel.select(timeout):
                if standby is not None and key.fileobj is standby.listener:
                    dialer = standby.admit()
                    if dialer is not None:
                        sel.register(dialer, selectors.EVENT_READ)
                elif standby is not None and key.fileobj in standby.pending:
                    sel.unregister(key.fileobj)
                    if link.sock is not None and _hung_up(link.sock):
                        sel.unregister(link.sock)  # its EOF, not read yet: it is gone
                        link.lost()
                        standby.wait_from_now()
                    new = standby.answer(key.fileobj, attached=link.sock is not None)
                    if new is not None:
                        link.attach(new, standby.epoch, sorted(children))
                        sel.register(new, selectors.EVENT_READ)
                elif key.fileobj is link.sock:
                    data, fds, _flags, _addr = socket.recv_fds(link.sock, _MAX_PACKET, 4)
                    if not data:
                        sel.unregister(link.sock)
                        link.lost()
                        if standby is None:
                            return
                        standby.wait_from_now()
                        continue
                    req = msgpack.unpackb(data)
                    if req["op"] == "takeover":
                        standby = Standby(req)
                        sel.register(standby.listener, selectors.EVENT_READ)
                        continue
                    if req["op"] == "quit":
                        return
                    if req["op"] == "kill":
                        if req["pid"] in children:
                            os.kill(req["pid"], req.get("sig", signal.SIGKILL))
                        continue
                    if req["op"] == "spare":  # without a config: none
                        if req["cfg"] is None:
                            spares.retire()
                        else:
                            spares.want(template(req["cfg"]))
                        continue
                    spare = spares.take(req, fds)
                    if spare is None:
                        page = _new_page()
                        pid = os.fork()
                        if pid == 0:
                            server = spares.fds()
                            _child(
                                link.sock,
                                wake_r,
                                wake_w,
                                req,
                                fds,
                                server_pid,
                                standby,
                                server,
                                page,
                            )
                    else:
                        pid, page = spare
                    for fd in fds:
                        os.close(fd)
                    children.add(pid)
                    link.send({"op": "spawned", "id": req["id"], "pid": pid}, page)
                else:
                    os.read(wake_r, 4096)
                    for pid in _reap(link, children):
                        spares.exited(pid)
    finally:
        if standby is not None:
            standby.close()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer of `sock` is gone (its close seen, whatever is still queued)."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    return any(ev & (select.POLLHUP | select.POLLRDHUP) for _, ev in poller.poll(0))


def _serve_listener(sel: selectors.BaseSelector, standby: Standby) -> None:
    """Watch the standby listener only while a dialer could be admitted (Standby.full)."""
    watched = standby.listener in sel.get_map()
    if watched and standby.full():
        sel.unregister(standby.listener)
    elif not watched and not standby.full():
        sel.register(standby.listener, selectors.EVENT_READ)


def _new_page() -> int | None:
    """A death lock page for the child about to be forked (None: this kernel has none)."""
    if not _deathlock.available():
        return None
    try:
        return _deathlock.new_page()
    except OSError:  # no descriptor or memory left: that worker is watched by its EOF
        return None


def _reap(link: ControllerLink, children: set[int]) -> list[int]:
    """Report every child that exited; return their pids."""
    reaped: list[int] = []
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        children.discard(pid)
        reaped.append(pid)
        link.send({"op": "exit", "pid": pid, "status": status, "reason": describe_status(status)})
    return reaped


def main() -> None:
    fd = int(os.environ.pop("OTPMESH_FORKSERVER_FD"))
    preload = [m for m in os.environ.pop("OTPMESH_PRELOAD", "").split(",") if m]
    sock = socket.socket(fileno=fd)
    try:
        serve(sock, ["otpmesh._runtime._worker", *preload])
    except (BrokenPipeError, ConnectionResetError):
        pass


if __name__ == "__main__":
    main()
