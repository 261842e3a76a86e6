"""Monarch's ``monarch.config``: ``configure``, ``configured`` and the runtime layer they change.

Monarch's settings tune its Rust runtime (hyperactor); otpmesh's runtime is another one, so
each key Monarch documents is accepted here, kept in this process's runtime layer and read
back as Monarch's are, and ``SETTINGS`` says, key by key, what it means here, or why it
means nothing. A key Monarch does not document is refused, naming the ones it does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_RUST = "tunes Monarch's Rust runtime (hyperactor), which otpmesh does not have"
_LOGS = "worker output goes to the controller's stderr as it is written (nothing to capture)"

#: Every key Monarch's ``configure`` takes, with what it means here.
SETTINGS: dict[str, str] = {
    "default_transport": "otpmesh picks its transport: Unix sockets on a host, TCP across",
    "enable_log_forwarding": _LOGS,
    "enable_file_capture": _LOGS,
    "tail_log_lines": _LOGS,
    "codec_max_frame_length": "otpmesh's frame limit is its wire's (otpmesh._wire), not set here",
    "message_delivery_timeout": "a call here waits for its actor, or fails when it dies",
    "host_spawn_ready_timeout": _RUST,
    "mesh_proc_spawn_max_idle": _RUST,
    "process_exit_timeout": _RUST,
    "message_ack_time_interval": _RUST,
    "message_ack_every_n_messages": _RUST,
    "message_ttl_default": _RUST,
    "split_max_buffer_size": _RUST,
    "split_max_buffer_age": _RUST,
    "stop_actor_timeout": _RUST,
    "cleanup_timeout": _RUST,
    "default_encoding": "messages here are msgpack, always",
    "channel_net_rx_buffer_full_check_interval": _RUST,
    "channel_tcp_congestion": _RUST,
    "message_latency_sampling_rate": _RUST,
    "enable_dest_actor_reordering_buffer": _RUST,
    "mesh_bootstrap_enable_pdeathsig": "workers here always end with their controller",
    "mesh_terminate_concurrency": _RUST,
    "mesh_terminate_timeout": _RUST,
    "small_write_threshold": _RUST,
    "max_cast_dimension_size": _RUST,
    "remote_alloc_bind_to_inaddr_any": "hosts join through otpmesh.launchers",
    "remote_alloc_bootstrap_addr": "hosts join through otpmesh.launchers",
    "remote_alloc_allowed_port_range": "hosts join through otpmesh.launchers",
    "read_log_buffer": _LOGS,
    "force_file_log": _LOGS,
    "prefix_with_rank": _LOGS,
    "actor_spawn_max_idle": _RUST,
    "get_actor_state_max_idle": _RUST,
    "supervision_watchdog_timeout": _RUST,
    "proc_stop_max_idle": _RUST,
    "get_proc_state_max_idle": _RUST,
    "mesh_admin_addr": "otpmesh's live view is `otpmesh watch`",
    "mesh_attach_config_timeout": "attach_to_workers is not in otpmesh.monarch",
    "mesh_orphan_timeout": "workers here end as soon as their controller does",
    "rdma_allow_tcp_fallback": "otpmesh.rdma falls back to TCP by itself, and says so",
    "rdma_disable_ibverbs": "otpmesh.rdma picks its backend (docs/guides/rdma.md)",
    "rdma_max_chunk_size_mb": _RUST,
    "rdma_ibverbs_target": _RUST,
    "rdma_peer_device_affinity": _RUST,
    "rdma_runtime_worker_threads": _RUST,
}

# This process's runtime layer, as Monarch's is one per process.
_runtime: dict[str, Any] = {}


def configure(**settings: Any) -> None:
    """Set keys of this process's runtime layer (``SETTINGS`` says what each means here)."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(
            f"configure(): unknown setting(s) {', '.join(map(repr, unknown))}; Monarch's are: "
            f"{', '.join(sorted(SETTINGS))}"
        )
    _runtime.update(settings)


def get_runtime_config() -> dict[str, Any]:
    """A copy of the runtime layer: the keys set with ``configure``."""
    return dict(_runtime)


def get_global_config() -> dict[str, Any]:
    """The merged view: here, the runtime layer (otpmesh keeps no other layers of these)."""
    return dict(_runtime)


def clear_runtime_config() -> None:
    """Forget every key set with ``configure``."""
    _runtime.clear()


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """``configure(**overrides)`` for the ``with`` block; the layer as it was afterwards."""
    before = get_runtime_config()
    try:
        configure(**overrides)
        yield get_global_config()
    finally:
        clear_runtime_config()
        _runtime.update(before)


__all__ = [
    "SETTINGS",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
]
