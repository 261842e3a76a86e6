"""The serving recipe (supervisors/serving_router.py) and its benchmark: a replica SIGKILLed
mid-stream loses no request and repeats no token; drain refuses new requests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import otpmesh
from supervisors import serving_router
from tests.conftest import run_trio

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_the_benchmark_kills_a_replica_mid_stream_and_loses_and_repeats_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otpmesh.bench", "serving", "--small", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["in_flight_at_kill"] > 0  # the kill landed mid-stream
    assert figures["resumed_on_another_replica"] >= 1
    assert (figures["lost"], figures["repeated_tokens"]) == (0, 0)
    assert figures["requests"] > figures["in_flight_at_kill"]


@pytest.mark.timeout(60)
def test_the_recipe_streams_in_order_and_a_draining_router_takes_no_new_request() -> None:
    async def body() -> list[str]:
        async with otpmesh.start(serving_router.make_tree(replicas=2, step=0.001)) as app:
            router = app.actor("serving/router")
            port, receiver = otpmesh.Channel[str].open()
            assert await router.generate("p", 4, port) == 1  # one replica took it
            got = [tok async for tok in receiver]
            await router.drain()
            late, _ = otpmesh.Channel[str].open()
            with pytest.raises(otpmesh.ActorError, match="draining"):
                await router.generate("q", 4, late)
            return got

    assert run_trio(body) == ["p:0", "p:1", "p:2", "p:3"]


def test_the_recipe_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, "supervisors/serving_router.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "['hello:0', 'hello:1', 'hello:2', 'hello:3', 'hello:4']" in done.stdout
