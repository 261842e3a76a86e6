"""Heartbeats that a held controller loop does not stop: each agent's lifeline.

A driver that runs a synchronous step in the controller's trio loop (CPU work, a blocking call)
holds that loop; beats sent from it would stop, and every agent would fence (kill its workers)
after AGENT_TIMEOUT. So, once registered, an agent dials a second connection to the cluster
listener: the same handshake and proof of the cluster secret as its registration, then a HELLO
``{"lifeline": host_id, "token": ...}`` with the one-time token its registration handed it. The
controller hands that socket, with its frame-MAC state, to ONE thread (``Lifelines``), which
from then on owns it entirely: it writes the controller's beats and reads the agent's, recording
when it last heard each host (``time.monotonic``). Held loop or not, beats flow both ways while
the network does; the trio side reads ``Lifeline.silent_for()`` when it judges a host.

The thread never blocks on a peer: non-blocking sockets under one selector; at most one beat is
queued per lifeline (a peer that does not read gets no more), frames are tiny and bounded
(MAX_FRAME), and anything but a beat with a good MAC closes that lifeline. It covers a held
loop for a while, not for ever: once the loop has not turned for ``held_limit`` seconds (a
deadlocked driver), it stops beating, and the agents fence as they would for a lost controller.
The agent treats a lost lifeline as a lost controller; the controller declares a host whose
lifeline broke dead.
"""

from __future__ import annotations

import logging
import math
import selectors
import socket
import threading
import time
from typing import Any

from .._core._errors import ProtocolError
from .._wire import _codec
from .._wire._framemac import FrameMac
from .._wire._frames import SYS
from .._wire._framing import FrameDecoder, frame_header

log = logging.getLogger("otpmesh.cluster")

#: A lifeline carries beats only: a frame past this size is an error.
MAX_FRAME = 256
BEAT = _codec.pack([SYS, -1, "beat", None])


def is_beat(message: Any) -> bool:
    return isinstance(message, list) and message[:3] == [SYS, -1, "beat"] and len(message) == 4


class Lifeline:
    """One host's lifeline, owned by the ``Lifelines`` thread once added. The trio side reads
    ``silent_for()`` and ``close_reason``, and calls ``close``; nothing else."""

    def __init__(self, sock: socket.socket, mac: FrameMac | None, name: str) -> None:
        self.sock = sock
        self.name = name
        self._mac = mac
        self._decoder = FrameDecoder(MAX_FRAME)
        self._out = b""  # the rest of the beat being written
        self.last_seen = time.monotonic()  # a float store: atomic under the GIL
        self.close_reason: str | None = None

    def silent_for(self) -> float:
        """Seconds since the agent's last beat arrived, by this process's monotonic clock."""
        return time.monotonic() - self.last_seen

    def close(self, why: str) -> None:
        """Close it (either side may; the thread drops it at its next turn)."""
        if self.close_reason is None:
            self.close_reason = why
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ------------------------------------------------------------ the thread's side

    def _beat(self) -> None:
        if self._out:  # the last beat is not written yet: the peer is not reading
            return
        tag = () if self._mac is None else (self._mac.seal((BEAT,)),)
        self._out = b"".join((frame_header(len(BEAT) + sum(map(len, tag))), BEAT, *tag))
        self._flush()

    def _flush(self) -> None:
        try:
            self._out = self._out[self.sock.send(self._out) :]
        except BlockingIOError:
            pass

    def _read(self) -> None:
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            return
        if not data:
            raise ProtocolError("closed by the agent")
        for frame in self._decoder.feed(data):
            payload = frame if self._mac is None else self._mac.open(frame)
            if not is_beat(_codec.unpack(payload)):
                raise ProtocolError("a lifeline carries beats only")
            self.last_seen = time.monotonic()


class Lifelines:
    """The thread that owns every lifeline of one cluster: ``start``, ``add``, ``stop``."""

    def __init__(self, interval: float, held_limit: float = math.inf) -> None:
        self._interval = interval
        # The trio loop's last turn (``tick``): held past `held_limit`, the thread beats no more.
        self._held_limit = held_limit
        self._loop_seen = time.monotonic()  # a float store: atomic under the GIL
        self._lock = threading.Lock()
        self._added: list[Lifeline] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False
        self._silent = False
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="otpmesh-lifelines", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, line: Lifeline) -> None:
        line.sock.setblocking(False)
        with self._lock:
            if self._stopping:  # the thread is gone, or takes no more: nobody would close it
                line.close("the cluster stopped")
                line.sock.close()
                return
            self._added.append(line)
        self._wake()

    def tick(self) -> None:
        """The controller's loop took a turn (its heartbeat round): beats may go on."""
        self._loop_seen = time.monotonic()

    def _loop_held(self, now: float) -> bool:
        """Whether the loop has been held past the limit: a controller hung for good (a
        deadlocked driver) must not keep its hosts' workers, nor a standby out, forever."""
        held = now - self._loop_seen
        if held <= self._held_limit:
            self._warned = False
            return False
        if not self._warned:
            self._warned = True
            log.warning(
                "the controller's event loop has been held for %.0f s (past %g s): its "
                "lifelines beat no more, so its hosts' agents fence their workers as for a lost "
                "controller (a standby, if any, may take over)",
                held,
                self._held_limit,
            )
        return True

    def silence(self) -> None:
        """Send no beat from now on (the lifelines stay open): a controller that stops acting
        (cut off from most of its hosts, _hostover.py) lets its agents time out as before."""
        self._silent = True

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._wake()
        self._thread.join(timeout=5.0)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full: it is awake anyway
            pass

    def _run(self) -> None:
        lines: dict[int, Lifeline] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            due = time.monotonic()
            while not self._stopping:
                with self._lock:
                    added, self._added = self._added, []
                for line in added:
                    lines[line.sock.fileno()] = line
                    sel.register(line.sock, selectors.EVENT_READ)
                now = time.monotonic()
                if now >= due:
                    due = now + self._interval
                    quiet = self._silent or self._loop_held(now)
                    for line in [] if quiet else lines.values():
                        self._guard(line, line._beat)
                for key, _ in sel.select(max(0.0, due - time.monotonic())):
                    if key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        line = lines[key.fd]
                        self._guard(line, line._read)
                for fd, line in list(lines.items()):
                    if line.close_reason is not None:
                        sel.unregister(line.sock)
                        line.sock.close()
                        del lines[fd]
            with self._lock:
                added, self._added = self._added, []
            for line in [*lines.values(), *added]:
                line.close("the cluster stopped")
                line.sock.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    @staticmethod
    def _guard(line: Lifeline, step: Any) -> None:
        if line.close_reason is not None:
            return
        try:
            if line._out:
                line._flush()
            step()
        except Exception as exc:  # a broken peer ends its lifeline, never the thread
            log.debug("lifeline of host %s closed: %s", line.name, exc)
            line.close(str(exc) or type(exc).__name__)
