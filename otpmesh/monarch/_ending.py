"""How an unhandled fault ends a Monarch-style program: once, with an exit status.

The program must end from its main thread, where Python runs its ``finally`` blocks and then its
``atexit`` functions (which stop the workers), so the fault interrupts that thread, as Monarch
does. The interrupt is a real SIGINT sent to the main thread, which wakes it where it waits (a
``.get()`` blocked on a result: a simulated one would wait for the result first), and
``Future.get`` turns it into ``SystemExit`` with the fault's status: the program exits 1 after
the one line the fault printed, not 130 after an interrupt's traceback. An interrupt that lands
in the program's own code instead stays a ``KeyboardInterrupt``, as in Monarch.
"""

from __future__ import annotations

import _thread
import signal
import threading

_lock = threading.Lock()
_status: list[int] = []  # the status the program is ending with, once it is
_taken: list[bool] = []  # the interrupt was turned into SystemExit (once: a later one is Ctrl-C)


def ending_status() -> int | None:
    """The exit status an unhandled fault is ending the program with; None while it is not.
    Once set it stays: later faults are not reported again while the program ends (or, where
    something catches the SystemExit, as IPython does, after: otpmesh's log still names them)."""
    return _status[0] if _status else None


def take_ending() -> int | None:
    """The status to exit with, for the interrupt of the fault that ends the program: once."""
    with _lock:
        if not _status or _taken:
            return None
        _taken.append(True)
        return _status[0]


def end_program(status: int) -> bool:
    """End the program with `status` (interrupt its main thread); False if it is ending
    already."""
    with _lock:
        if _status:
            return False
        _status.append(status)
    main = threading.main_thread()
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not main and callable(handler) and main.ident is not None:
        signal.pthread_kill(main.ident, signal.SIGINT)  # its Python handler runs in the main thread
    else:  # the fault is heard on the main thread (trio runs there), or SIGINT is not Python's
        _thread.interrupt_main()
    return True
