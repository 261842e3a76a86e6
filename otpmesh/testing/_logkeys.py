"""What must agree between a running app's event log and the reference model's, entry by
entry, and the comparison itself.

Both logs are split by tree (``_trees.per_tree``) before they are compared, and each tree's
entries are compared in order. An owned subtree writes to its owner's tree's log, and the two
interleave nondeterministically: when an owner exits, its subtree is stopped in the background
while the owner's supervisor logs the exit and restarts it, so the subtree's termination
entries may come before, between or after the owner's; the model does these one after the
other. Within one tree the order is OTP's, with one exception that ``in_batches`` covers: a
parallel-shutdown supervisor's terminations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._core._exits import ActorCrash, Hung, ProcessExit
from .._core._supevents import LogEntry, LogKind
from ._trees import per_tree


def reason_key(reason: object) -> object:
    """A reason as the machine compares it: crashes by type and message, process deaths by kind
    only (the pid and the wording of the death differ from run to run), hangs by kind and the
    endpoint that hung (the stacks and the time it took differ)."""
    if isinstance(reason, ActorCrash):
        return ("ActorCrash", reason.type_name, reason.message)
    if isinstance(reason, ProcessExit):
        return ("ProcessExit",)
    if isinstance(reason, Hung):
        return ("Hung", reason.endpoint)
    if isinstance(reason, tuple | list):
        return tuple(reason_key(r) for r in reason)
    return reason


def entry_key(entry: LogEntry, t0: float, times: bool) -> tuple[object, ...]:
    """What must agree between the real log and the model's, entry by entry."""
    at = round(entry.time - t0, 6) if times else None
    return (
        at,
        str(entry.kind),
        entry.path,
        entry.child,
        entry.incarnation,
        reason_key(entry.reason),
    )


_BATCHED = (str(LogKind.CHILD_TERMINATED), str(LogKind.SHUTDOWN_ERROR))


def in_batches(keys: list[tuple[object, ...]], parallel: frozenset[str]) -> list[object]:
    """`keys` (``entry_key``s, in log order) with each run of terminations by one parallel
    shutdown supervisor (a mesh stops its members at once) in a fixed order: they end in
    whatever order the members happen to stop, the model's in the order it asked."""
    out: list[object] = []
    i = 0
    while i < len(keys):
        j = i
        while j < len(keys) and keys[j][1] in _BATCHED and keys[j][2] in parallel:
            if keys[j][2] != keys[i][2]:
                break
            j += 1
        if j - i > 1:
            out.extend(sorted(keys[i:j], key=repr))
            i = j
        else:
            out.append(keys[i])
            i += 1
    return out


def first_difference(
    real: Sequence[LogEntry],
    model: Sequence[LogEntry],
    owners: Iterable[str],
    parallel: frozenset[str],
    times: bool,
) -> tuple[str, int] | None:
    """None if the logs agree tree by tree; else the tree ("" for the top, else its owner's
    path) and the index, in that tree's entries, of the first difference."""
    owners = list(owners)
    t_real = real[0].time if real else 0.0
    reals, models = per_tree(real, owners), per_tree(model, owners)
    for tree in sorted(set(reals) | set(models)):
        got = in_batches([entry_key(e, t_real, times) for e in reals.get(tree, [])], parallel)
        want = in_batches([entry_key(e, 0.0, times) for e in models.get(tree, [])], parallel)
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
            return tree, min(len(got), len(want)) if at is None else at
    return None
