"""``python -m otpmesh.bench rl --small``: a smoke test of the RL benchmark's code paths (the
GRPO example with timed actors, a rollout SIGKILLed mid-generate, the learner SIGKILLed
mid-update), run as a user runs it. No timing is asserted: only that every figure is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otpmesh.bench._rl_table import RESTART_FIGURES

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(240)
def test_small_bench_reports_every_phase_and_both_kills_as_json() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OTPMESH_PRELOAD"}  # torch preloaded
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "rl", "--small", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # stdout is the JSON alone: the example's lines go to stderr
    [toy] = result["variants"]
    assert toy["variant"] == "toy" and toy["parameters"] == 22154
    assert set(toy["phases_s"]) == {
        "weight_sync",
        "handle",
        "read",
        "generate",
        "score",
        "update",
        "checkpoint",
        "before_update",
    }
    assert 0 < toy["weight_sync_share"] < 1
    phases = toy["phases_s"]
    assert phases["weight_sync"] == phases["handle"] + phases["read"]
    assert toy["kill_rounds"] == 1
    assert set(toy["load_1m"]) == {"before", "after"}
    rollout, learner = toy["rollout_sigkill_mid_generate"], toy["learner_sigkill_mid_update"]
    assert set(RESTART_FIGURES) | {"iteration_s", "extra_s", "extra_before_update_s"} == set(
        rollout
    )
    assert set(RESTART_FIGURES) | {"iteration_s", "extra_s", "kill_to_update_again_s"} == set(
        learner
    )
    assert set(RESTART_FIGURES) - {"kill_to_first_reply_s"} == set(toy["rollout_sigkill_idle"])
    # The rollout's lost call went to its next incarnation alone; the learner's lost update
    # was asked again of the new learner, after it restored the checkpoint, with the same
    # batches: neither iteration was re-run whole.
    assert "re-run after" in done.stderr and "iteration 2 re-run" not in done.stderr
    assert "  update 3 re-run after ActorDiedError: rl/learner/0 is dead" in done.stderr
    assert "iteration 3 re-run" not in done.stderr
    assert "[rl/learner/0] resumed from " in done.stderr


def test_table_has_a_row_per_figure_and_a_column_per_variant() -> None:
    from rich.console import Console

    from otpmesh.bench._rl_table import table

    figures = {f: 0.5 for f in RESTART_FIGURES} | {"iteration_s": 1.0, "extra_s": 0.25}
    variant = {
        "variant": "toy",
        "parameters": 22154,
        "load_1m": {"before": 1.0, "after": 2.0},
        "start_to_end_of_iteration_0_s": 3.0,
        "tree_up_s": 2.0,
        "iteration_s": 0.1,
        "iterations_timed": 19,
        "phases_s": dict.fromkeys(
            ("generate", "score", "update", "checkpoint", "before_update"), 0.01
        )
        | {"weight_sync": 0.01, "handle": 0.003, "read": 0.007},
        "kill_rounds": 3,
        "weight_sync_share": 0.1,
        "rollout_sigkill_mid_generate": figures | {"extra_before_update_s": 0.125},
        "learner_sigkill_mid_update": figures | {"kill_to_update_again_s": 0.375},
        "rollout_sigkill_idle": {f: 0.75 for f in RESTART_FIGURES}
        | {"kill_to_process_start_s": -20.5},  # the spare it restarted in was forked before
    }
    console = Console(width=120, record=True)
    console.print(table({"machine": {"cpus": 2}, "variants": [variant]}))
    text = console.export_text()
    assert "toy (0.02M params)" in text and "1.00 / 2.00" in text and "+0.125 s" in text
    assert "10.0 ms (10.0 %)" in text  # the weight sync and its share
    assert "0.100 s (19)" in text  # the median iteration and how many it is the median of
    assert "handle round trip" in text and "3.0 ms" in text
    assert "rollout SIGKILLed between iterations" in text and "0.750 s" in text
    assert "before the kill (20.500 s)" in text and "-20" not in text
    assert "kill to the update asked again" in text and "0.375 s" in text
    assert "score" in text and "10.0 ms" in text  # under a tenth of a second: in ms
    # The idle kill has no extra time: its row is left out, not filled with "-".
    assert text.count("extra time of that iteration") == 2
