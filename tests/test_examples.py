"""Every example runs, as a user would run it, and prints what its docstring promises."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def _run(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_hello_world_greets_from_every_actor_and_one() -> None:
    out = _run("hello_world.py")
    for rank in range(4):
        assert f"Hello, world! from greeters/{rank} at {{'procs': {rank}}}" in out
    assert "Hello, rank two! from greeters/2" in out


def test_broadcast_vs_unicast_shows_results_and_costs() -> None:
    out = _run("broadcast_vs_unicast.py", "--calls", "50")
    assert "mesh.square(3)     -> ValueMesh({'procs': 4}, [9, 9, 9, 9])" in out
    assert "mesh[1].square(3)  -> 9" in out
    # 3 mesh-wide calls + 1 unicast to rank 1 + 1 chosen actor: 14 messages, FIFO-counted
    counts = out.split("messages per actor: ")[1].splitlines()[0]
    assert sum(ast.literal_eval(counts)) == 14
    assert "broadcast to 4 actors" in out


def test_kill_an_actor_shows_the_restarts_while_the_others_keep_answering() -> None:
    out = _run("kill_an_actor.py")
    assert "rank 1 raised: RuntimeError: simulated rollout bug" in out
    assert "others:       r2:" in out
    after = out.split("after:")[1].splitlines()[0]
    assert "r1:" in after and "steps1" in after.split("r1:")[1].split()[0]  # a fresh incarnation
    assert "child_exited         rl/rollouts/1 #1  (crashed with RuntimeError" in out
    assert "child_started        rl/rollouts/1 #2" in out
    assert "(its process (pid" in out and "killed by signal 9 (SIGKILL))" in out
    assert "child_started        rl/rollouts/3 #2" in out


def test_chaos_rollouts_answers_every_call_while_actors_are_killed() -> None:
    out = _run("chaos_rollouts.py", "--faults", "15", "--rate", "5", "--seed", "3")
    summary = out.strip().splitlines()[-1]
    faults, restarts = (int(summary.split()[0]), int(summary.split(", ")[1].split()[0]))
    # A count of faults, not a duration: the first (a kill, before any restart) always hits.
    assert faults == 15 and 1 <= restarts <= 15
    answered, calls = summary.split("; ")[1].split(" calls")[0].split(" of ")
    assert answered == calls
    assert summary.endswith("0 failed)")


def test_rdma_transfer_syncs_weights_and_prints_the_table() -> None:
    out = _run(
        "rdma_transfer.py", "--sizes", "1", "4", "--backends", "shm", "tcp",
        "--what", "read_into", "argument",
    )  # fmt: skip
    # Two sandboxed workers (docs/security.md): shm copies only to and from the controller.
    assert "read and wrote 4096 bytes over tcp" in out
    assert "learner's weights now sum to 1047552 (was 523776)" in out
    rows = [line.split() for line in out.splitlines() if "MiB" in line]
    assert [(r[0], r[2], r[3]) for r in rows] == [
        (size, backend, what)
        for backend in ("shm", "tcp")
        for size in ("1", "4")
        for what in ("read_into", "argument")
    ], rows
    assert all(float(r[4]) > 0 for r in rows)


def test_multihost_local_spreads_a_mesh_over_two_hosts_and_survives_losing_one() -> None:
    out = _run("multihost_local.py")
    before, after = out.split("== SIGKILL host local1's agent")
    for rank, host in enumerate(["local0", "local0", "local1", "local1"]):
        assert f"rl/rollouts/{rank} on host {host}" in before
    assert "child_exited   rl/rollouts/2  #1  its process" in after
    assert "was lost with host local1" in after
    assert "child_started  rl/rollouts/3  #2" in after
    for rank in range(4):  # all four answer again, from the host that is left
        assert f"rl/rollouts/{rank} on host local0" in after


def test_process_group_survives_a_sigkill_in_all_reduce_and_restores_from_its_checkpoint() -> None:
    out = _run("process_group.py")
    # dp/0 is killed by the group's restart, or (on a loaded host) its all_reduce fails first.
    assert (
        "the blocked call fails: dp/0 is dead" in out
        or "the blocked call fails: dp/0 raised" in out
    )
    # The group's first exit the supervisor hears of is rank 1's SIGKILL or, when gloo saw its
    # peer go before the controller did, rank 0's failed all_reduce: either restarts both.
    exits = [line.strip() for line in out.splitlines() if line.strip().startswith("child_exited")]
    assert exits, out
    assert ("dp/1: its process" in exits[0] and "killed by signal 9" in exits[0]) or (
        "dp/0: crashed with" in exits[0]
    ), out
    before = out.split("before: ")[1].splitlines()[0]
    after = out.split("after:  ")[1].splitlines()[0]
    assert "'epoch': 1, 'step': 3" in before and "'epoch': 2, 'step': 3" in after
    # The new epoch's members restored the checkpointed weights in on_start.
    weights = before.split("'w': ")[1].split(", 'pid'")[0]
    assert f"'w': {weights}" in after
    assert "new epoch: 2, new processes: True" in out
    assert "ranks agree: True" in out


def test_rl_service_owns_its_replicas_and_escalates_to_its_supervisor() -> None:
    out = _run("rl_service.py")
    assert "answers: ['p0->0', 'p1->1', 'p2->2', 'p3->0', 'p4->1', 'p5->2']" in out
    assert "replica 1 is back in pid" in out
    assert "looked up: ActorMesh('rl/service/replicas', shape={'procs': 3}) -> " in out
    escalation = out.split("escalation")[1]
    # The replicas' supervisor gave up, then its owner crashed with its error and came back.
    assert escalation.index("supervisor_exited  rl/service/replicas") < escalation.index(
        "child_exited       rl/service #1  (crashed with SupervisorError"
    )
    assert "child_started      rl/service #2" in escalation


def test_sync_script_calls_with_get_reduces_and_runs_a_tree_without_an_event_loop() -> None:
    out = _run("sync_script.py")
    assert "incr on all: ValueMesh({'procs': 2}, [11, 11])" in out
    assert "incr on one: 16" in out and "sum of all:  29" in out
    assert "tree counter: 2" in out
    pids = [int(p) for p in [*out.split("pids:")[1].split()[:2], out.split("tree pid:")[1]]]
    assert len(set(pids)) == 3


def test_serving_engine_batches_concurrent_requests_and_answers_a_bad_one() -> None:
    out = _run("serving_engine.py")
    assert "8 answers in 2 batches: ['P0', 'P1', 'P2', 'P3', 'P4', 'P5', 'P6', 'P7']" in out
    assert "empty prompt -> ValueError; the engine lives: 2 batches so far" in out
    assert "reloaded: vocabulary of 32000" in out


def test_from_monarch_prints_the_same_through_otpmesh_monarch_and_natively() -> None:
    through_monarch = _run("from_monarch.py")
    native = _run("from_monarch.py", "--native")
    assert through_monarch == native
    assert "steps: [2, 2, 2, 2]" in native
    assert "refused: learning rate must be positive, not -1.0" in native
    assert "rank 3: 3 steps at lr 0.1" in native


def test_ports_replies_later_streams_and_fails_a_waiting_caller_on_sigkill() -> None:
    out = _run("ports.py")
    for item in (1, 2, 3):
        assert f"item {item} went in a batch of total 6" in out
    assert "6 samples from 3 actors: [(0, 0), (0, 0), (1, 0), (1, 1), (2, 0), (2, 2)]" in out
    assert "item 7: ActorDiedError, delivered=True: " in out and "signal 9" in out
    assert "restarted, batch now 0 long" in out


def test_peer_heal_restores_a_killed_replica_from_a_peer_and_a_killed_mesh_from_its_fallback() -> (
    None
):
    out = _run("peer_heal.py", "--mb", "8")
    before = out.split("before:")[1].splitlines()[0].split(", from")[0]
    healed = out.split("healed:")[1].splitlines()[0]
    assert healed.split(", from")[0] == before and healed.endswith("from a live peer")
    for rank in range(4):
        assert f"rank {rank}:   version 100, sum 2097152.000, from the checkpoint" in out


def test_takeover_runs_to_the_end_as_the_active_controller(tmp_path: Path) -> None:
    # The takeover itself (a standby, a SIGKILL) is tests/test_takeover.py's, on this example.
    out = _run("takeover.py", "--dir", str(tmp_path / "state"), "--steps", "5", "--pause", "0")
    assert "starts at step 0, incarnations [1, 1, 1, 1]" in out
    for rank in range(4):
        assert f"shard {rank}: step 5 total {(rank + 1) * 15} pid" in out


def test_gather_calls_answers_every_call_in_order_and_reports_a_failure() -> None:
    out = _run("gather_calls.py", "--calls", "2000")
    assert "2000 calls, replies in order: True" in out
    assert "with return_exceptions: ['int', 'ActorError'] 4" in out
    assert "raised once both ended: ValueError" in out
