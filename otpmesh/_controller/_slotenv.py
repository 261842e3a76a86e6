"""What a worker process of a mesh slot starts with: its GPU and otpmesh's environment."""

from __future__ import annotations

import os


def visible_gpus() -> list[str]:
    """GPU ids this host exposes, found without initialising CUDA (fork-safe)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def otpmesh_settings() -> dict[str, str]:
    """otpmesh's own settings as they are now (the fork server's copy is from its start): read
    once per mesh, not per slot (a walk of the whole environment, 54 us with 35 variables)."""
    return {k: v for k, v in os.environ.items() if k.startswith("OTPMESH_")}


def slot_env(
    coords: dict[str, int], rank: int, gpus: list[str], settings: dict[str, str] | None = None
) -> dict[str, str]:
    env = dict(otpmesh_settings() if settings is None else settings)
    env["OTPMESH_RANK"] = str(rank)
    if "gpus" in coords and gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[coords["gpus"] % len(gpus)]
    return env
