"""Pipelined calls across a SIGKILL: 10,000 calls in flight to one actor while its process is
killed and restarted. Every call ends exactly once (one reply or one ActorDiedError), replies
of one incarnation come in the order it served them with none missing in between, and no
call runs twice. A real worker process and a real SIGKILL, sent once the actor has served a
given number of calls (counted from its replies, never after a sleep)."""

from __future__ import annotations

import itertools
import os
import signal
from collections import defaultdict

import pytest
import trio

import otpmesh
from otpmesh import Supervisor, Worker
from tests.conftest import run_trio
from tests.pipelined_actors import Ledger

IN_FLIGHT = 10_000
ROUNDS = 3  # calls per caller task: the later ones go to the next incarnation
KILL_AFTER = 4_000  # replies received before the SIGKILL


@pytest.mark.timeout(240)
def test_ten_thousand_calls_in_flight_across_a_sigkill_end_exactly_once_and_in_order() -> None:
    outcomes: dict[int, tuple[str, int] | BaseException] = {}
    sent_in_order: list[int] = []  # seq numbers in the order their frames were written
    seqs = itertools.count()

    async def main() -> tuple[str, list[int]]:
        tree = Supervisor("p", intensity=5, period=60.0, children=[Worker("w", Ledger)])
        async with otpmesh.start(tree) as app:
            ref = app.actor("p/w")
            victim = await ref.pid()
            replied = trio.Event()

            async def caller() -> None:
                for _ in range(ROUNDS):
                    seq = next(seqs)
                    sent_in_order.append(seq)
                    try:
                        outcomes[seq] = await ref.note(seq)
                    except otpmesh.ActorDiedError as exc:
                        if seq in outcomes:
                            raise AssertionError(f"call {seq} ended twice") from exc
                        outcomes[seq] = exc
                    if len(outcomes) >= KILL_AFTER:
                        replied.set()

            async with trio.open_nursery() as nursery:
                for _ in range(IN_FLIGHT):
                    nursery.start_soon(caller)
                await replied.wait()
                os.kill(victim, signal.SIGKILL)
            assert await ref.pid() != victim
            return await ref.ledger()

    last_token, last_served = run_trio(main, timeout=220)

    # Exactly once: every call ended, once (a reply or a death), none invented.
    assert sorted(outcomes) == list(range(IN_FLIGHT * ROUNDS))
    died = [s for s, o in outcomes.items() if isinstance(o, BaseException)]
    assert died, "the SIGKILL landed after every call: it tested nothing"
    replies: dict[str, list[tuple[int, int]]] = defaultdict(list)  # token -> (n, seq)
    for seq, outcome in outcomes.items():
        if not isinstance(outcome, BaseException):
            token, n = outcome
            replies[token].append((n, seq))
    assert len(replies) == 2, f"two incarnations answered, not {len(replies)}"
    assert last_token in replies

    for token, served in replies.items():
        served.sort()
        numbers = [n for n, _ in served]
        # In order, none missing in between: what an incarnation served before it died
        # reached the caller as a prefix of what it served (the stream was cut, not holed).
        assert numbers == list(range(len(numbers))), f"incarnation {token}: replies with gaps"
    # The surviving incarnation ran exactly the calls it answered, each once.
    assert [seq for _, seq in replies[last_token]] == last_served
    assert len(set(last_served)) == len(last_served)
    # The killed incarnation served calls in the order they were written to it.
    first = next(t for t in replies if t != last_token)
    position = {seq: i for i, seq in enumerate(sent_in_order)}
    order = [position[seq] for _, seq in replies[first]]
    assert order == sorted(order), "the first incarnation served calls out of send order"
    # No call ran in both incarnations; the deaths are the calls neither answered.
    answered = {seq for served in replies.values() for _, seq in served}
    assert len(answered) == sum(len(s) for s in replies.values())
    assert answered.isdisjoint(died)
