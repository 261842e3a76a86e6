"""Serving, measured: ``python -m otpmesh.bench serving [--small] [--json]``.

Runs the serving recipe (``supervisors/serving_router.py``: a router owning asyncio engine
replicas, each request's tokens streamed back, a request whose engine dies resumed on another
from the first token its caller has not had) under a closed loop of clients, and SIGKILLs one
engine in the middle of the run, while requests stream from it. It reports:

- requests per second and tokens per second, before the kill and after it;
- latency p50 and p99 at steady state (requests that ended before the kill), and for the
  requests in flight when the engine died, beside the bare time of a request (its tokens times
  the engine's decode step): the ratio is what the router, the wire and the clients add;
- lost requests (a call that failed, or a stream that missed a token) and repeated tokens
  (target 0 and 0), and how many requests were resumed on another replica;
- the load average (1 minute) before and after, beside every figure: on a shared machine the
  absolute times say as much about the other jobs as about otpmesh.

It must run from a checkout (the recipe is not part of the installed package).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import trio

import otpmesh


@dataclass
class Request:
    started: float
    ended: float = 0.0
    lost: bool = False
    repeated: int = 0


@dataclass
class Run:
    requests: list[Request] = field(default_factory=list)
    killed_at: float = 0.0


def _recipe() -> Any:
    try:
        return importlib.import_module("supervisors.serving_router")
    except ImportError as err:
        raise SystemExit(
            "python -m otpmesh.bench serving runs the recipe in supervisors/serving_router.py, "
            f"which is in the checkout, not in the installed package ({err}): run it from the "
            "checkout's root"
        ) from None


async def _client(
    router: otpmesh.ActorRef, recipe: Any, name: str, n: int, until: float, run: Run
) -> None:
    count = 0
    while trio.current_time() < until:
        prompt = f"{name}-{count}"
        count += 1
        request = Request(trio.current_time())
        run.requests.append(request)
        port, receiver = otpmesh.Channel[str].open()
        try:
            await router.generate(prompt, n, port)
        except otpmesh.OtpmeshError:
            request.lost = True
            receiver.close()
        got: list[str] = []
        with trio.move_on_after(5.0):
            async for tok in receiver:
                got.append(tok)
        request.ended = trio.current_time()
        request.repeated = len(got) - len(set(got))
        if set(got) != {recipe.token(prompt, i) for i in range(n)}:
            request.lost = True


async def _kill_one(router: otpmesh.ActorRef, at: float, run: Run) -> None:
    await trio.sleep_until(at)
    pids = await router.engine_pids()
    os.kill(pids[1], signal.SIGKILL)
    run.killed_at = trio.current_time()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _figures(run: Run, n: int, step: float, seconds: float) -> dict[str, Any]:
    done = [r for r in run.requests if r.ended]
    before = [r for r in done if r.ended < run.killed_at]
    after = [r for r in done if r.started >= run.killed_at]
    around = [r for r in done if r.started <= run.killed_at <= r.ended]
    steady_ms = [(r.ended - r.started) * 1e3 for r in before]
    around_ms = [(r.ended - r.started) * 1e3 for r in around]
    half = seconds / 2
    bare_ms = n * step * 1e3
    return {
        "requests": len(done),
        "rps_before_kill": round(len(before) / half, 1),
        "rps_after_kill": round(len(after) / half, 1),
        "tokens_per_s_before_kill": round(len(before) * n / half, 1),
        "bare_request_ms": round(bare_ms, 1),
        "steady_p50_ms": round(_percentile(steady_ms, 0.5), 1),
        "steady_p99_ms": round(_percentile(steady_ms, 0.99), 1),
        "steady_p50_over_bare": round(_percentile(steady_ms, 0.5) / bare_ms, 2),
        "in_flight_at_kill": len(around),
        "at_kill_p50_ms": round(_percentile(around_ms, 0.5), 1),
        "at_kill_p99_ms": round(_percentile(around_ms, 0.99), 1),
        "lost": sum(r.lost for r in done),
        "repeated_tokens": sum(r.repeated for r in done),
    }


async def bench(replicas: int, clients: int, n: int, step: float, seconds: float) -> dict[str, Any]:
    recipe = _recipe()
    run = Run()
    load = os.getloadavg()[0]
    async with otpmesh.start(recipe.make_tree(replicas, step)) as app:
        router = app.actor("serving/router")
        port, _ = otpmesh.Channel[str].open()
        await router.generate("warm-up", n, port)  # every process up, every path warm
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for c in range(clients):
                nursery.start_soon(_client, router, recipe, f"c{c}", n, start + seconds, run)
            nursery.start_soon(_kill_one, router, start + seconds / 2, run)
        resumed = await router.drain()
    figures = _figures(run, n, step, seconds)
    figures.update(
        resumed_on_another_replica=resumed,
        replicas=replicas,
        clients=clients,
        tokens_per_request=n,
        decode_step_ms=step * 1e3,
        load_before=round(load, 2),
        load_after=round(os.getloadavg()[0], 2),
    )
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m otpmesh.bench serving", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--small", action="store_true", help="a short run (the suite's smoke test)")
    parser.add_argument("--json", action="store_true", help="one JSON object, nothing else")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--step", type=float, default=0.005, help="decode step, seconds")
    args = parser.parse_args(argv)
    seconds = 2.0 if args.small else 8.0
    started = time.perf_counter()
    figures = otpmesh.run(bench, args.replicas, args.clients, args.tokens, args.step, seconds)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(figures))
        return
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    if figures["lost"] or figures["repeated_tokens"]:
        print("LOST OR REPEATED: see above", file=sys.stderr)


if __name__ == "__main__":
    main()
