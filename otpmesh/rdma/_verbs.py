"""pyverbs, imported lazily, and this process's RDMA device: the probe, the device opened on
first use, the source GID it is reached by; the ibverbs backend's errors.

pyverbs: Debian/Ubuntu's ``python3-pyverbs`` (built with rdma-core, for the system Python) is the
supported install. Another CPython of the same minor version can use it by putting *only* the
``pyverbs`` package on its path (a directory holding a symlink to
``/usr/lib/python3/dist-packages/pyverbs``); see ``tests/rdma/run_softroce.sh``. The PyPI
``pyverbs`` sdist needs rdma-core's build tree and does not build on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# Settings, all optional: which device/port/GID index this process uses.
ENV_DEVICE = "OTPMESH_IBVERBS_DEVICE"
ENV_PORT = "OTPMESH_IBVERBS_PORT"
ENV_GID_INDEX = "OTPMESH_IBVERBS_GID_INDEX"

# Outstanding RDMA READs per QP; clipped to the device's limits and the peer's.
RD_ATOMIC = 16
# One work request moves at most this much (RC messages may be up to 2 GiB; stay well below).
MAX_CHUNK = 1 << 30

PYVERBS_MISSING = (
    "pyverbs is not installed: apt-get install python3-pyverbs, then make it visible to this "
    "Python (a directory with a symlink to /usr/lib/python3/dist-packages/pyverbs on PYTHONPATH, "
    "or a venv made with --system-site-packages from /usr/bin/python3; see docs/rdma.md)"
)


class IbverbsError(RuntimeError):
    """A transfer over ibverbs failed; the queue pair was torn down (the next one reconnects)."""


class IbverbsRemoteAccessError(IbverbsError):
    """The owner's device refused the access: the buffer was dropped (unregistered)."""


class IbverbsPeerLost(IbverbsError):
    """The owner's queue pair stopped answering: the owner process is most likely dead."""


class IbverbsTimeout(IbverbsError, TimeoutError):
    """The transfer did not complete before the backend's own deadline."""


def pyverbs() -> Any:
    """Import pyverbs lazily (it is optional and absent on most machines); return the package."""
    import pyverbs.addr
    import pyverbs.cq
    import pyverbs.device
    import pyverbs.mr
    import pyverbs.pd
    import pyverbs.pyverbs_error
    import pyverbs.qp
    import pyverbs.wr

    return pyverbs


def enums() -> Any:
    # rdma-core < 50 names the module pyverbs.enums, later versions pyverbs.libibverbs_enums.
    try:
        import pyverbs.enums as enums
    except ImportError:
        import pyverbs.libibverbs_enums as enums
    return enums


def wc_status_name(status: int) -> str:
    # Completion statuses are the IBV_WC_*_ERR names (opcodes share the IBV_WC_ prefix).
    e = enums()
    for name in dir(e):
        if name.startswith("IBV_WC_") and name.endswith("_ERR") and getattr(e, name) == status:
            return name
    return f"status {status}"


@dataclass
class Device:
    """This process's open device: context, protection domain, port and address."""

    ctx: Any
    pd: Any
    name: str
    port: int
    gid_index: int
    gid: str
    lid: int
    ethernet: bool
    roce_v2: bool
    mtu: int
    max_chunk: int
    max_rd_atomic: int  # as initiator (device max_qp_init_rd_atom)
    max_dest_rd_atomic: int  # as responder (device max_qp_rd_atom)


def probe() -> tuple[str | None, str]:
    """(why ibverbs is unusable here or None, the device the probe vouched for)."""
    try:
        pv = pyverbs()
        e = enums()
    except ImportError:
        return PYVERBS_MISSING, ""
    try:
        devices = pv.device.get_device_list()
    except pv.pyverbs_error.PyverbsError as exc:
        # libibverbs fails this way when the kernel has no RDMA support at all.
        hint = "" if os.path.isdir("/sys/class/infiniband") else "; no /sys/class/infiniband"
        return f"no RDMA device (ibv_get_device_list failed: {exc}{hint})", ""
    if not devices:
        return "no RDMA device (ibv_get_device_list is empty)", ""
    names = [d.name.decode() for d in devices]
    wanted = os.environ.get(ENV_DEVICE)
    port = int(os.environ.get(ENV_PORT, "1"))
    if wanted and wanted not in names:
        return f"RDMA device {wanted!r} ({ENV_DEVICE}) not found; devices: {names}", ""
    reasons = []
    for name in [wanted] if wanted else names:
        # Open and close again: nothing verbs-related stays open until the first real use,
        # so a process that only asked does not carry a device context across fork().
        try:
            with pv.device.Context(name=name) as ctx:
                state = ctx.query_port(port).state
        except pv.pyverbs_error.PyverbsError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        if state == e.IBV_PORT_ACTIVE:
            return None, name
        reasons.append(f"{name} port {port} is not active (state {state})")
    return "no usable RDMA device: " + "; ".join(reasons), ""


def open_device(name: str) -> Device:
    """Open the device `name` (the one the probe vouched for) on the configured port."""
    pv, e = pyverbs(), enums()
    port = int(os.environ.get(ENV_PORT, "1"))
    ctx = pv.device.Context(name=name)
    try:
        port_attr = ctx.query_port(port)
        dev_attr = ctx.query_device()
        ethernet = port_attr.link_layer == e.IBV_LINK_LAYER_ETHERNET
        gid_index, gid, roce_v2 = _pick_gid(ctx, port, port_attr.gid_tbl_len, ethernet)
        return Device(
            ctx=ctx,
            pd=pv.pd.PD(ctx),
            name=name,
            port=port,
            gid_index=gid_index,
            gid=gid,
            lid=int(port_attr.lid),
            ethernet=ethernet,
            roce_v2=roce_v2,
            mtu=int(port_attr.active_mtu),
            max_chunk=min(int(port_attr.max_msg_sz) or MAX_CHUNK, MAX_CHUNK),
            max_rd_atomic=max(1, min(RD_ATOMIC, int(dev_attr.max_qp_init_rd_atom))),
            max_dest_rd_atomic=max(1, min(RD_ATOMIC, int(dev_attr.max_qp_rd_atom))),
        )
    except BaseException:
        ctx.close()
        raise


def _pick_gid(ctx: Any, port: int, table_len: int, ethernet: bool) -> tuple[int, str, bool]:
    """Choose the source GID: the setting, else on Ethernet (RoCE) an IPv4-mapped RoCEv2 GID
    (routable, what rxe and most RoCE fabrics use), else the first non-zero one."""
    e = enums()
    configured = os.environ.get(ENV_GID_INDEX)
    candidates = [int(configured)] if configured else list(range(table_len))
    found: list[tuple[int, str, bool]] = []
    for index in candidates:
        try:
            gid = str(ctx.query_gid(port, index))
        except Exception:
            continue
        if gid.replace(":", "").strip("0") == "":
            continue  # an empty slot of the table
        v2 = False
        if ethernet:
            try:
                v2 = ctx.query_gid_type(port, index) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
            except Exception:
                v2 = False
        found.append((index, gid, v2))
    if not found:
        raise IbverbsError(f"no usable GID on port {port} (table of {table_len})")
    if ethernet and not configured:
        found.sort(key=lambda f: (not f[2], not f[1].startswith("0000:0000:0000:0000:0000:ffff")))
    return found[0]


# ---- owner side ---------------------------------------------------------------------------


def close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception:  # best effort: teardown of something already failed or gone
        pass
