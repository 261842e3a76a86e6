"""The RL suite's figures as a table (``python -m otpmesh.bench rl`` without ``--json``): their
labels, in the order the job meets them, and how each is shown."""

from __future__ import annotations

from typing import Any

#: The weight sync's parts, in the order they happen.
SYNC_PARTS = (
    ("handle", "handle round trip (learner.weights())"),
    ("read", "read_into flat_parameters (slowest rollout)"),
)
KILLS = (
    ("rollout_sigkill_mid_generate", "rollout SIGKILLed mid-generate"),
    ("learner_sigkill_mid_update", "learner SIGKILLed mid-update"),
    ("rollout_sigkill_idle", "rollout SIGKILLed between iterations"),
)
#: Where a SIGKILLed actor's restart went, in the order it happens (see ``rl._killed``).
RESTART_FIGURES = (
    "kill_to_process_start_s",
    "kill_to_module_imported_s",
    "kill_to_constructor_s",
    "constructor_and_on_start_s",
    "kill_to_ready_s",
    "kill_to_first_reply_s",
)


def seconds(value: float, sign: str = "") -> str:
    """A duration as a reader quotes it: milliseconds under a tenth of a second."""
    if abs(value) < 0.1:
        return f"{value * 1e3:{sign}.1f} ms"
    return f"{value:{sign}.3f} s"


def table(result: dict[str, Any]) -> Any:
    """The figures as a rich table: a row per figure, a column per variant; a row no variant
    has a figure for is left out."""
    from rich.table import Table

    variants = result["variants"]
    out = Table(title=f"GRPO job, otpmesh ({result['machine']['cpus']} CPUs)")
    out.add_column("figure")
    for v in variants:
        out.add_column(f"{v['variant']} ({v['parameters'] / 1e6:.2f}M params)", justify="right")

    def row(label: str, get: Any, show: Any = seconds) -> None:
        cells = []
        for v in variants:
            try:
                cells.append(show(get(v)))
            except KeyError:
                cells.append("-")
        if any(cell != "-" for cell in cells):
            out.add_row(label, *cells)

    def extra(value: float) -> str:
        return seconds(value, "+")

    row(
        "load (1 min) before / after",
        lambda v: (v["load_1m"]["before"], v["load_1m"]["after"]),
        lambda loads: f"{loads[0]:.2f} / {loads[1]:.2f}",
    )
    row("start to the end of iteration 0", lambda v: v["start_to_end_of_iteration_0_s"])
    row("  of which the tree up", lambda v: v["tree_up_s"])
    row(
        "iteration (median of N)",
        lambda v: (v["iteration_s"], v["iterations_timed"]),
        lambda it: f"{seconds(it[0])} ({it[1]})",
    )
    row(
        "  weight sync (share of the iteration)",
        lambda v: (v["phases_s"]["weight_sync"], 100 * v["weight_sync_share"]),
        lambda sync: f"{seconds(sync[0])} ({sync[1]:.1f} %)",
    )
    for phase, label in SYNC_PARTS:
        row(f"    {label}", lambda v, p=phase: v["phases_s"][p])
    for phase in ("generate", "score", "update", "checkpoint"):
        row(f"  {phase}", lambda v, p=phase: v["phases_s"][p])
    row("  start to the update (sync, generate, score)", lambda v: v["phases_s"]["before_update"])
    row("kill rounds (medians over them)", lambda v: v["kill_rounds"], str)
    for key, label in KILLS:
        if not any(key in v for v in variants):
            continue
        out.add_section()
        out.add_row(label)
        row("  extra time of that iteration", lambda v, k=key: v[k]["extra_s"], extra)
        row("  extra before the update", lambda v, k=key: v[k]["extra_before_update_s"], extra)
        row("  kill to the update asked again", lambda v, k=key: v[k]["kill_to_update_again_s"])
        for figure in RESTART_FIGURES:
            row(f"  {figure[:-2].replace('_', ' ')}", lambda v, k=key, f=figure: v[k][f], before)
    return out


def before(value: float) -> str:
    """A restart figure; one before the kill (a spare worker forked ahead, a module it had
    imported already) says so rather than showing a negative time."""
    return seconds(value) if value >= 0 else f"before the kill ({seconds(-value)})"
