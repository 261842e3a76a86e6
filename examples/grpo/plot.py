"""The reward curve as a PNG, drawn with matplotlib (the optional ``plot`` extra).

A title, axis labels, the curve, a red mark at every iteration that saw a restart, and a legend
saying so. Without matplotlib the plot is skipped with a word on how to get it; the run itself
needs nothing beyond torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def write_line_plot(
    path: Path, values: Sequence[float], *, marks: Sequence[int] = (), title: str = ""
) -> bool:
    """Plot `values` (rewards on [0, 1]) per iteration into the PNG at `path`, marking the
    iterations in `marks`; False (and a message) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no plot: matplotlib is not installed (pip install 'otpmesh[plot]'); not {path}")
        return False
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
    try:
        ax.plot(range(len(values)), values, color="tab:blue", label="mean reward")
        for i, iteration in enumerate(marks):
            ax.axvline(
                iteration,
                color="tab:red",
                alpha=0.6,
                linewidth=1,
                label="a restart in this iteration" if i == 0 else None,
            )
        ax.set(title=title, xlabel="iteration", ylabel="mean reward", ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return True
