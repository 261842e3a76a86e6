"""Where ``otpmesh stacks`` meets its app: without ``XDG_RUNTIME_DIR`` the usual directory
(``otpmesh-UID`` in the temporary directory) is a name anyone can create first. A look-alike is
never trusted, and no longer switches the command off: the app makes a private directory beside
it and the command finds it there. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

APP = """
import otpmesh, trio
from otpmesh import Supervisor, Worker
from tests.hang_actors import Stuck

async def main():
    async with otpmesh.start(Supervisor("s", children=[Worker("w", Stuck)])):
        print("up", flush=True)
        await trio.sleep(120)

trio.run(main)
"""
ROOT = Path(__file__).resolve().parent.parent


def _squat(usual: Path, how: str) -> None:
    """Make `usual` as another user (or a careless one) could have."""
    if how.startswith("another user's"):
        if os.getuid() != 0:
            pytest.skip("needs root to make a directory owned by another uid")
        usual.mkdir(mode=0o755)
        os.chown(usual, 65534, 65534)  # nobody
        if how.endswith("fallbacks"):  # names that sort before any mkdtemp name
            for i in range(20):
                fake = usual.parent / f"{usual.name}-+{i:02d}"
                fake.mkdir(mode=0o700)
                os.chown(fake, 65534, 65534)
    elif how == "open to others":
        usual.mkdir()
        usual.chmod(0o777)
    else:  # a symlink, even to a private directory of ours, is not the directory itself
        target = usual.parent / "elsewhere"
        target.mkdir(mode=0o700)
        usual.symlink_to(target)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "how",
    ["another user's", "another user's, with look-alike fallbacks", "open to others", "a symlink"],
)
def test_otpmesh_stacks_works_when_the_usual_directory_is_a_look_alike(
    tmp_path: Path, how: str
) -> None:
    usual = tmp_path / f"otpmesh-{os.getuid()}"
    _squat(usual, how)
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env.update(TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    app = subprocess.Popen(
        [sys.executable, "-c", APP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert app.stdout is not None and app.stdout.readline() == "up\n"
        out = subprocess.run(
            [sys.executable, "-m", "otpmesh", "stacks", str(app.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        assert "1 actor: s/w" in out.stdout
    finally:
        app.send_signal(signal.SIGINT)
        _, err = app.communicate(timeout=60)
    # The app said why, and where it went instead; nothing was written into the look-alike.
    ours = (p for p in tmp_path.glob(f"otpmesh-{os.getuid()}-*") if p.stat().st_uid == os.getuid())
    fallbacks = sorted(ours)
    assert len(fallbacks) == 1 and (fallbacks[0].stat().st_mode & 0o777) == 0o700
    assert f"{usual} is not a private directory of yours" in err, err
    assert f"otpmesh stacks uses {fallbacks[0]} instead" in err, err
    assert usual.is_symlink() or not any(usual.iterdir())


@pytest.mark.timeout(60)
def test_otpmesh_stacks_names_a_look_alike_directory_and_the_fix(tmp_path: Path) -> None:
    usual = tmp_path / f"otpmesh-{os.getuid()}"
    _squat(usual, "open to others")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "otpmesh", "stacks", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2
    assert f"{usual} is not a private directory of yours (its mode 0o777 lets" in out.stderr
    assert "removing it (as its owner, or root) restores the usual place" in out.stderr
