"""A serving engine: requests batched by a concurrent endpoint, a blocking reload that calls
another actor from its thread, and bad requests answered as the caller's error.

- ``generate`` is ``@endpoint(concurrent=True)``: eight requests are in flight at once, and
  the one that fills a batch of four runs the forward pass for all of them. Served one at a
  time, the first request would wait for a batch that never fills.
- ``reload`` is ``@endpoint(blocking=True)``: a plain def that blocks (reading weights, here a
  sleep) runs in a worker thread, and asks the tokenizer actor for its vocabulary through
  ``trio.from_thread.run``.
- The class is ``let_it_crash=False``: an empty prompt is the caller's ``ValueError``; the
  engine keeps its state (no restart).

Run: ``python examples/serving_engine.py``. It prints::

    8 answers in 2 batches: ['P0', 'P1', 'P2', 'P3', 'P4', 'P5', 'P6', 'P7']
    empty prompt -> ValueError; the engine lives: 2 batches so far
    reloaded: vocabulary of 32000
"""

from __future__ import annotations

import time

import trio

import otpmesh
from otpmesh import Supervisor, Worker


class Batch:
    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.done = trio.Event()


class Tokenizer(otpmesh.Actor):
    @otpmesh.endpoint
    def vocab_size(self) -> int:
        return 32000


class Engine(otpmesh.Actor, let_it_crash=False):
    def __init__(self, batch_size: int) -> None:
        self.batch_size, self.batch, self.batches = batch_size, Batch(), 0

    @otpmesh.endpoint(concurrent=True)
    async def generate(self, prompt: str) -> str:
        if not prompt:
            raise ValueError("empty prompt")
        batch = self.batch
        batch.prompts.append(prompt)
        if len(batch.prompts) == self.batch_size:  # full: run it, release its requests
            self.batch, self.batches = Batch(), self.batches + 1
            await trio.sleep(0.01)  # one forward pass for the whole batch
            batch.done.set()
        await batch.done.wait()
        return prompt.upper()

    @otpmesh.endpoint
    def stats(self) -> int:
        return self.batches

    @otpmesh.endpoint(blocking=True)
    def reload(self, tokenizer: otpmesh.ActorRef) -> int:
        time.sleep(0.05)  # reading weights: blocks this thread, not the process
        vocab: int = trio.from_thread.run(tokenizer.vocab_size.call_one)
        return vocab


tree = Supervisor(
    "serve",
    children=[Worker("tokenizer", Tokenizer), Worker("engine", Engine, args=(4,))],
)


async def main() -> None:
    async with otpmesh.start(tree) as app:
        engine, tokenizer = app.actor("serve/engine"), app.actor("serve/tokenizer")
        answers: dict[int, str] = {}

        async def ask(i: int) -> None:
            answers[i] = await engine.generate(f"p{i}")

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(ask, i)
        ordered = [answers[i] for i in range(8)]
        print(f"{len(answers)} answers in {await engine.stats()} batches: {ordered}")
        try:
            await engine.generate("")
        except otpmesh.ActorError as err:
            batches = await engine.stats()
            print(f"empty prompt -> {err.type_name}; the engine lives: {batches} batches so far")
        print(f"reloaded: vocabulary of {await engine.reload(tokenizer)}")


if __name__ == "__main__":
    otpmesh.run(main)
