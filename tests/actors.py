"""Actor classes used by the runtime tests (importable by worker processes)."""

from __future__ import annotations

import gc
import os
from typing import Any

import trio

import otpmesh


class Echo(otpmesh.Actor):
    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag
        self.seen: list[Any] = []

    @otpmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @otpmesh.endpoint
    def echo_sync(self, x: Any) -> Any:
        return x

    @otpmesh.endpoint
    def whoami(self) -> dict[str, Any]:
        ctx = otpmesh.context()
        return {
            "name": ctx.name,
            "path": ctx.path,
            "rank": ctx.rank,
            "coords": ctx.coords,
            "shape": ctx.shape,
            "pid": os.getpid(),
            "tag": self.tag,
            "host": os.environ.get("OTPMESH_HOST"),
            "netns": os.readlink("/proc/self/ns/net"),
        }

    @otpmesh.endpoint
    async def hold(self, gate: str) -> None:
        """Busy (this actor answers nothing else) until the file `gate` exists; `gate`.held
        says it has begun."""
        open(f"{gate}.held", "w").close()
        while not os.path.exists(gate):
            await trio.sleep(0.01)

    @otpmesh.endpoint
    def record(self, x: Any) -> None:
        self.seen.append(x)

    @otpmesh.endpoint
    async def record_later(self, x: Any) -> None:
        """`record`, after a checkpoint (an endpoint that suspends: never run inline)."""
        await trio.sleep(0)
        self.seen.append(x)

    @otpmesh.endpoint
    def history(self) -> list[Any]:
        return self.seen

    @otpmesh.endpoint
    async def sleep(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds

    @otpmesh.endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @otpmesh.endpoint(let_it_crash=False)
    def fail_softly(self, message: str) -> None:
        raise KeyError(message)

    @otpmesh.endpoint(let_it_crash=True)
    def fail_hard(self, message: str) -> None:
        raise ValueError(message)  # crashes it, supervised or not

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    def shout(self, text: str) -> None:
        print(text, flush=True)

    @otpmesh.endpoint
    async def call_peer(self, peer: Any, x: Any) -> dict[str, Any]:
        """Call another actor through a ref passed in a message."""
        value = await peer.echo(x)
        return {"value": value, "via_pid": os.getpid()}

    @otpmesh.endpoint
    def torch_loaded(self) -> bool:
        import sys

        return "torch" in sys.modules

    @otpmesh.endpoint
    def unsendable(self) -> Any:
        return object()


class BadInit(otpmesh.Actor):
    def __init__(self) -> None:
        raise RuntimeError("constructor refused")


# ---- actors for the supervision tests ------------------------------------------------------

#: In-process record of hook calls (placement="local" tests read it directly).
JOURNAL: list[tuple[str, str, Any]] = []


class Member(otpmesh.Actor):
    """A supervised actor that records its life in JOURNAL (or a file, across processes)."""

    def __init__(self, journal_file: str | None = None, stop_delay: float = 0.0) -> None:
        self.journal_file = journal_file
        self.stop_delay = stop_delay
        self.calls = 0
        self._note("init", None)

    def _note(self, what: str, detail: Any) -> None:
        path = otpmesh.context().path
        JOURNAL.append((path, what, detail))
        if self.journal_file:
            with open(self.journal_file, "a") as f:
                f.write(f"{path} {what} {detail!r}\n")

    async def on_stop(self, reason: object) -> None:
        self._note("on_stop", reason)
        if self.stop_delay:
            await trio.sleep(self.stop_delay)

    @otpmesh.endpoint
    def ping(self) -> str:
        self.calls += 1
        return otpmesh.context().path

    @otpmesh.endpoint
    def count(self) -> int:
        self.calls += 1
        return self.calls

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint(let_it_crash=True)  # crashes it, supervised or not
    def crash(self, why: str = "on purpose") -> None:
        raise RuntimeError(why)

    @otpmesh.endpoint
    def quit(self, reason: Any = "normal") -> str:
        self.stop(reason)
        return "bye"

    @otpmesh.endpoint
    async def nap(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds

    @otpmesh.endpoint
    def keep(self, peer: Any) -> None:
        self.kept = peer

    @otpmesh.endpoint
    async def call_kept(self, method: str) -> Any:
        """Call the ref stored by keep(): it must still reach its actor after restarts."""
        return await self.kept.endpoint(method)()

    @otpmesh.endpoint
    async def relay(self, peer: Any, method: str) -> Any:
        """Call `peer` (a ref that came in this message) from inside this actor."""
        return await peer.endpoint(method)()

    @otpmesh.endpoint
    def block(self, seconds: float) -> None:
        import time

        self._note("block", seconds)  # a test waits for this line, not for a guessed delay
        time.sleep(seconds)  # stuck outside trio: only killing the process ends it


class FailsToStart(otpmesh.Actor):
    def __init__(self) -> None:
        raise RuntimeError("cannot start")


class Ignores(otpmesh.Actor):
    async def on_start(self) -> None:
        raise otpmesh.Ignore()


# ---- actors for the tensor-channel tests --------------------------------------------------


class TensorOwner(otpmesh.Actor):
    """Owns tensors and registers them on the tensor channel."""

    def __init__(self) -> None:
        self.tensors: dict[int, Any] = {}
        self.buffers: dict[int, Any] = {}

    @otpmesh.endpoint
    def register(self, key: int, numel: int, dtype: str = "float32") -> Any:
        import torch

        from otpmesh.rdma import RDMABuffer

        t = torch.arange(numel, dtype=getattr(torch, dtype))
        self.tensors[key] = t
        self.buffers[key] = RDMABuffer(t)
        return self.buffers[key]

    @otpmesh.endpoint
    def value(self, key: int) -> Any:
        return self.tensors[key]

    @otpmesh.endpoint
    def drop(self, key: int) -> None:
        self.buffers[key].drop()

    @otpmesh.endpoint
    def pins(self) -> int:
        node = otpmesh._node._node.current_node()
        registry = None if node is None else node.channel._registry  # type: ignore[union-attr]
        assert registry is not None
        return sum(sum(r.pins.values()) for r in registry.buffers.values())

    @otpmesh.endpoint
    def registered(self) -> int:
        node = otpmesh._node._node.current_node()
        registry = None if node is None else node.channel._registry  # type: ignore[union-attr]
        return 0 if registry is None else len(registry.buffers)


class TensorReader(otpmesh.Actor):
    @otpmesh.endpoint
    async def read(
        self, buf: Any, numel: int, dtype: str = "float32", timeout: float | None = None
    ) -> Any:
        import torch

        dst = torch.zeros(numel, dtype=getattr(torch, dtype))
        await buf.read_into(dst, timeout=timeout)
        return {"tensor": dst, "backend": buf.backend}

    @otpmesh.endpoint
    async def write(self, buf: Any, value: Any) -> str:
        await buf.write_from(value)
        return str(buf.backend)

    @otpmesh.endpoint(let_it_crash=False)
    async def read_wrong(self, buf: Any, shape: list[int], dtype: str) -> None:
        import torch

        await buf.read_into(torch.zeros(shape, dtype=getattr(torch, dtype)))


class Intruder(otpmesh.Actor):
    """An actor that tries what a compromised worker would: node operations on another worker."""

    @otpmesh.endpoint
    async def node_op(self, addr: str, op: str, payload: Any) -> str:
        from otpmesh._node._node import current_node

        node = current_node()
        assert node is not None
        try:
            result = await node.sys_call(await node.connect(addr), op, payload, addr)
        except otpmesh.OtpmeshError as exc:
            return f"refused: {exc}"
        return f"done: {result!r}"


class Forger(otpmesh.Actor):
    """A compromised actor: it holds its app's secret (its worker does) and sends a controller
    HELLOs in other processes' names: a sibling's new worker, a host agent."""

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    async def hello(self, addr: str, payload: dict[str, Any]) -> str:
        """Dial `addr` with this process's secret and send one HELLO frame; say what came back
        before the connection closed: 'nothing', or how many bytes came first."""
        from otpmesh._node._node import current_node
        from otpmesh._wire import _codec
        from otpmesh._wire._frames import HELLO
        from otpmesh._wire._framing import frame_header
        from otpmesh._wire._handshake import dial, recv_some, send_all

        node = current_node()
        assert node is not None
        sock, mac = await dial(addr, node.secret_for(addr))
        try:
            frame = _codec.pack([HELLO, payload])
            tag = mac.seal((frame,)) if mac is not None else b""
            await send_all(sock, frame_header(len(frame) + len(tag)) + frame + tag)
            with trio.move_on_after(30):  # a hang guard: a refused HELLO is closed at once
                got = await recv_some(sock, 1 << 16)  # a frame, or b"" at the close
                return f"{len(got)} bytes" if got else "nothing"
            return "nothing, and still open"
        finally:
            sock.close()


class Configured(otpmesh.Actor):
    """An actor whose own keywords share names with supervision settings."""

    def __init__(self, strategy: str, period: float) -> None:
        self.settings = {"strategy": strategy, "period": period}

    @otpmesh.endpoint
    def settings_seen(self) -> dict[str, Any]:
        return self.settings


class Caller(otpmesh.Actor):
    """Calls other actors (or itself) from inside its endpoints: the deadlock tests' actor."""

    @otpmesh.endpoint
    def ping(self) -> str:
        return otpmesh.context().path

    @otpmesh.endpoint
    async def call(self, target: otpmesh.ActorRef) -> str:
        result: str = await target.ping()
        return result

    @otpmesh.endpoint
    async def via(self, other: otpmesh.ActorRef, back_to: otpmesh.ActorRef) -> str:
        result: str = await other.call(back_to)
        return result


class GilHolder(otpmesh.Actor):
    """Sleeps in C while holding the GIL: its heartbeat thread cannot run, as when a process
    is starved of CPU, or busy in an extension that never releases the GIL."""

    @otpmesh.endpoint
    def hold(self, seconds: float) -> int:
        import ctypes

        ctypes.PyDLL(None).usleep(int(seconds * 1e6))  # PyDLL: the GIL stays held
        return os.getpid()


class SlowGilStart(otpmesh.Actor):
    """A constructor that holds the GIL in C for `seconds`: its process sends no heartbeat
    while it starts (as one starved of CPU, or importing a large module, would not)."""

    def __init__(self, seconds: float) -> None:
        import ctypes

        ctypes.PyDLL(None).usleep(int(seconds * 1e6))  # PyDLL: the GIL stays held

    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


class Waiter(otpmesh.Actor):
    """Endpoints that wait for ever, writing to a journal file what happened to them."""

    def __init__(self, journal: str) -> None:
        self.journal = journal

    def _note(self, line: str) -> None:
        with open(self.journal, "a") as f:
            f.write(line + "\n")

    @otpmesh.endpoint
    async def wait_forever(self, tag: str) -> None:
        self._note(f"started {tag}")
        try:
            await trio.Event().wait()  # an event that never fires
        finally:
            self._note(f"finally {tag}")

    @otpmesh.endpoint
    def ping(self) -> str:
        return "pong"


class Asker(otpmesh.Actor):
    """Calls another actor with ``.get()`` from a blocking endpoint (a worker thread of its
    trio run), for tests/test_futures.py."""

    @otpmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @otpmesh.endpoint(blocking=True)
    def ask_in_thread(self, peer: Any, x: Any) -> Any:
        return peer.echo(x).get()


class GcReporter(otpmesh.Actor):
    """Tells its process's garbage-collector threshold (tests/test_gcpace.py)."""

    @otpmesh.endpoint
    def threshold(self) -> int:
        return gc.get_threshold()[0]


class MemoryReporter(otpmesh.Actor):
    """Tells what its process wrote of its own memory (tests/test_worker_memory.py)."""

    @otpmesh.endpoint
    def private_dirty_kb(self) -> int:
        with open("/proc/self/smaps_rollup") as rollup:
            return sum(int(line.split()[1]) for line in rollup if line.startswith("Private_Dirty:"))

    @otpmesh.endpoint
    def collect(self) -> int:
        return gc.collect()
