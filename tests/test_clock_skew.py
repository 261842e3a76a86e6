"""Hosts whose clocks disagree: heartbeats and fencing use only each side's own monotonic clock.

Host 1 runs in a time namespace whose monotonic clock is 11 days ahead (``unshare --time``) and
under libfaketime with its wall clock 3 days behind; host 2's wall clock is 7 days ahead. Nothing
notices while the network is up, and when host 1 is cut off its agent still fences its workers
and its actor restarts on the spare. Needs root (namespaces), util-linux's unshare with --time,
and faketime (``apt-get install faketime``, which ``bash .ci/dev slurm`` does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, launchers
from otpmesh.testing import netns
from tests.conftest import alive, run_trio

pytestmark = pytest.mark.slow

MONOTONIC_AHEAD = 11 * 86400
WALL_SKEW = {1: "-3d", 2: "+7d"}


class Clock(otpmesh.Actor):
    @otpmesh.endpoint
    def clocks(self) -> dict[str, float | int | str | None]:
        return {
            "wall": time.time(),
            "monotonic": time.monotonic(),
            "pid": os.getpid(),
            "host": os.environ.get("OTPMESH_HOST"),
        }


def _unavailable() -> str | None:
    why = netns.unavailable()
    if why is not None:
        return why
    if shutil.which("faketime") is None:
        return "faketime is not installed (apt-get install faketime)"
    probe = subprocess.run(
        ["unshare", "--time", "--fork", "--monotonic", "1", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"no time namespaces here: {probe.stderr.strip()}"
    return None


@pytest.fixture
def spaces() -> Iterator[netns.NetnsHosts]:
    why = _unavailable()
    if why is not None:
        pytest.skip(f"skewed hosts unavailable here: {why}")
    hosts = netns.make_hosts(3, subnet="10.234.0", kind="c")
    try:
        yield hosts
    finally:
        hosts.remove()


def _skewed(prefix: list[str], i: int) -> list[str]:
    if i not in WALL_SKEW:
        return prefix
    # The time namespace moves CLOCK_MONOTONIC; faketime moves only the wall clock (told to
    # leave the monotonic one alone), for the agent and, through the environment, its workers.
    ahead = ["unshare", "--time", "--fork", "--monotonic", str(MONOTONIC_AHEAD)]
    monotonic = ahead if i == 1 else []
    wall = ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-f", WALL_SKEW[i]]
    return [*prefix, *monotonic, *wall]


@pytest.mark.timeout(180)
def test_skewed_clocks_neither_fail_hosts_nor_stop_fencing(
    spaces: netns.NetnsHosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTPMESH_SECRET", "skew-test-secret")
    prefixes = [_skewed(p, i) for i, p in enumerate(spaces.prefixes())]
    launcher = launchers.Local(hosts=3, prefixes=prefixes, listen=spaces.listen())
    mesh = Mesh("clocks", Clock, shape={"hosts": 2, "procs": 1}, strategy=ONE_FOR_ONE)
    tree = Supervisor("root", strategy=ONE_FOR_ONE, intensity=5, children=[mesh])

    async def main() -> None:
        cluster = otpmesh.cluster(launcher, listen=spaces.controller_ip)
        async with cluster as hosts, otpmesh.start(tree) as app:
            clocks = app.mesh("root/clocks")
            here = {"wall": time.time(), "monotonic": time.monotonic()}
            seen = list((await clocks.clocks()).values())
            # The skew is real where the workers run.
            assert seen[0]["wall"] == pytest.approx(here["wall"], abs=600)
            assert seen[1]["wall"] == pytest.approx(here["wall"] - 3 * 86400, abs=600)
            assert seen[1]["monotonic"] > here["monotonic"] + MONOTONIC_AHEAD - 600
            since = len(app.events)
            # Five heartbeat timeouts (1 s each) pass: no host is thought dead for its clock.
            await trio.sleep(5)
            assert [h.alive for h in hosts.hosts] == [True, True, True]
            assert not [e for e in list(app.events)[since:] if e.kind == LogKind.CHILD_EXITED]
            # Cut off, the skewed host's agent still fences its worker by its own clock, and
            # its actor restarts on the spare, whose wall clock is a week ahead.
            lost = hosts.live[1]
            spaces.cut(1)
            with trio.fail_after(60):  # hang guards
                while lost.alive:
                    await trio.sleep(0.05)
                while alive(int(seen[1]["pid"])):  # type: ignore[arg-type]
                    await trio.sleep(0.05)
                while True:
                    moved = await clocks[1].clocks()
                    if moved["host"] == "local2":
                        break
                    await trio.sleep(0.05)
            assert moved["wall"] == pytest.approx(here["wall"] + 7 * 86400, abs=600)
            spaces.reconnect(1)

    run_trio(main, timeout=150)
