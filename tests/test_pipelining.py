"""Pipelined calls across a SIGKILL: 10,000 calls in flight to one actor while its process is
killed and restarted. Every call ends exactly once (one reply or one ActorDiedError), replies
of one incarnation come in the order it served them with none missing in between, and no
call runs twice. A real worker process and a real SIGKILL, sent once a given number of calls
have ended (counted from the caller's side, never after a sleep); what each incarnation ran
is read from a journal it writes per call, which the SIGKILL cannot take back."""

from __future__ import annotations

import itertools
import os
import signal
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import Supervisor, Worker
from tests.conftest import run_trio
from tests.pipelined_actors import Ledger

IN_FLIGHT = 10_000
ROUNDS = 3  # calls per caller task: the later ones go to the next incarnation
KILL_AFTER = 4_000  # calls ended before the SIGKILL


@pytest.mark.timeout(240)
def test_ten_thousand_calls_in_flight_across_a_sigkill_end_exactly_once_and_in_order(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    outcomes: dict[int, tuple[str, int] | BaseException] = {}
    sent_in_order: list[int] = []  # seq numbers in the order their frames were written
    seqs = itertools.count()

    async def main() -> None:
        tree = Supervisor(
            "p", intensity=5, period=60.0, children=[Worker("w", Ledger, args=(str(journal),))]
        )
        async with otpmesh.start(tree) as app:
            ref = app.actor("p/w")
            victim = await ref.pid()
            ended = trio.Event()

            async def caller() -> None:
                for _ in range(ROUNDS):
                    # Taken and sent in one step of this task (no checkpoint in between while
                    # the actor is up), so this order is the order the frames were written.
                    seq = next(seqs)
                    sent_in_order.append(seq)
                    try:
                        outcome: tuple[str, int] | BaseException = await ref.note(seq)
                    except otpmesh.ActorDiedError as exc:
                        outcome = exc
                    if seq in outcomes:
                        raise AssertionError(f"call {seq} ended twice")
                    outcomes[seq] = outcome
                    if len(outcomes) >= KILL_AFTER:
                        ended.set()

            async with trio.open_nursery() as nursery:
                for _ in range(IN_FLIGHT):
                    nursery.start_soon(caller)
                await ended.wait()
                os.kill(victim, signal.SIGKILL)
            assert await ref.pid() != victim

    run_trio(main, timeout=220)

    # Every call ended, once: a reply or a death, none lost, none invented.
    assert sorted(outcomes) == list(range(IN_FLIGHT * ROUNDS))
    ran = [line.split() for line in journal.read_text().splitlines()]
    runs = Counter(int(seq) for _, seq in ran)
    twice = [seq for seq, n in runs.items() if n > 1]
    assert not twice, f"{len(twice)} calls ran twice, e.g. {twice[:5]}"
    replies: dict[str, list[tuple[int, int]]] = defaultdict(list)  # token -> [(n, seq)]
    died = []
    for seq, outcome in outcomes.items():
        if isinstance(outcome, BaseException):
            died.append(seq)
        else:
            token, n = outcome
            replies[token].append((n, seq))
    assert len(replies) == 2, f"two incarnations answered, not {len(replies)}"
    # Calls in flight when the process died reached it (they may have run): each must say so
    # with an ActorDiedError, never be sent again behind its caller's back.
    assert died, "no call ended with ActorDiedError: calls lost with the actor were re-sent"
    # The incarnation that was killed: the one that answered the first call written.
    position = {seq: i for i, seq in enumerate(sent_in_order)}
    first = min(replies, key=lambda t: min(position[seq] for _, seq in replies[t]))
    ran_by = {int(seq): token for token, seq in ran}
    assert set(ran_by.values()) == set(replies), "an incarnation ran calls and answered none"
    # A reply came from the incarnation that ran the call; a death, for a call the killed
    # incarnation got and may have run (or never got), never for one run after the restart.
    for token, served in replies.items():
        assert all(ran_by[seq] == token for _, seq in served)
    for seq in died:
        assert ran_by.get(seq, first) == first, f"call {seq} ran after the restart, then died"
    for token, served in replies.items():
        served.sort()
        # In order, none missing in between: what an incarnation served reached its caller as
        # a prefix of what it served (a SIGKILL cuts the stream, it never holes it).
        assert [n for n, _ in served] == list(range(len(served))), f"{token}: replies with gaps"
    # The killed incarnation served its calls in the order they were written to it.
    order = [position[seq] for _, seq in replies[first]]
    assert order == sorted(order), "the first incarnation served calls out of send order"


GATHER_KILL_AT = 4_000  # the call the first incarnation is serving when it is SIGKILLed


@pytest.mark.timeout(240)
def test_ten_thousand_calls_in_flight_through_gather_across_a_sigkill_end_once_in_order(
    tmp_path: Path,
) -> None:
    """The same through ``otpmesh.gather``: 10,000 calls sent at once from one task, the
    actor's process SIGKILLed as it serves call 4,000 (after journaling it, before replying),
    then 10,000 more through gather to the restarting actor. Each call ends once, in its place:
    the first gather's results are a prefix of replies (of the first incarnation, numbered in
    argument order) followed only by deaths; a death is for a call the killed incarnation got
    (it may have run it) or never got, and no call ran twice; the second gather is answered
    in full by the new incarnation."""
    journal = tmp_path / "journal"

    async def main() -> tuple[list[object], list[object], int, int]:
        ledger = Worker("w", Ledger, args=(str(journal), GATHER_KILL_AT))
        tree = Supervisor("p", intensity=5, period=60.0, children=[ledger])
        async with otpmesh.start(tree) as app:
            ref = app.actor("p/w")
            victim = await ref.pid()
            first = await otpmesh.gather(
                *(ref.note(seq) for seq in range(IN_FLIGHT)), return_exceptions=True
            )
            second = await otpmesh.gather(
                *(ref.note(seq) for seq in range(IN_FLIGHT, 2 * IN_FLIGHT)),
                return_exceptions=True,
            )
            return first, second, victim, await ref.pid()

    first, second, victim, survivor = run_trio(main, timeout=220)
    assert survivor != victim
    assert len(first) == IN_FLIGHT and len(second) == IN_FLIGHT
    answered = [r for r in first if not isinstance(r, BaseException)]
    died = first[len(answered) :]
    assert all(isinstance(r, otpmesh.ActorDiedError) for r in died), "a reply after a death"
    assert died, "no call ended with ActorDiedError though its actor was SIGKILLed"
    assert all(r.delivered for r in died)  # type: ignore[attr-defined]
    tokens = {token for token, _ in answered}  # type: ignore[misc]
    assert len(tokens) == 1
    (killed,) = tokens
    # Replies in argument order, numbered as served: the actor served them in send order.
    assert [n for _, n in answered] == list(range(len(answered)))  # type: ignore[misc]
    assert len(answered) <= GATHER_KILL_AT  # the call being served when killed got no reply
    ran = [line.split() for line in journal.read_text().splitlines()]
    runs = Counter(int(seq) for _, seq in ran)
    assert not [seq for seq, n in runs.items() if n > 1], "a call ran twice"
    ran_by = {int(seq): token for token, seq in ran}
    assert all(ran_by[seq] == killed for seq in range(GATHER_KILL_AT + 1))
    for seq in range(len(answered), IN_FLIGHT):  # a death: run by the killed one, or by none
        assert ran_by.get(seq, killed) == killed, f"call {seq} ran after the restart, then died"
    # The second gather: every call answered by the new incarnation, each served once (while
    # the actor restarts they go the general way, a task each: served in no set order).
    assert not [r for r in second if isinstance(r, BaseException)]
    assert {token for token, _ in second} == {ran_by[IN_FLIGHT]} != {killed}  # type: ignore[misc]
    assert sorted(n for _, n in second) == list(range(IN_FLIGHT))  # type: ignore[misc]
