"""What makes two processes "the same host": the kernel's boot id and the PID namespace.

Hostnames lie (containers, namespaces, clones); a boot id is one running kernel, and
``process_vm_readv`` also needs the same PID namespace. Empty strings where /proc cannot say.
"""

from __future__ import annotations

import os


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
