"""A takeover's state directory is made only on a route no other user can redirect or swap:
not through a link another user owns, nor in a directory another user owns or may write to
without the sticky bit; a directory another user made first at the path is refused with what to
do instead. /tmp (sticky) and tempfile.mkdtemp() are fine."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from otpmesh import TakeoverError
from otpmesh._runtime._statedir import open_private, open_state_dir

NOBODY = 65534


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("making a file another user's or group's (chown) needs root")


def test_a_directory_anyone_may_write_to_is_refused_on_the_way(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user could rename the state directory and put theirs there
    with pytest.raises(TakeoverError, match=r"shared', which has mode 0777: any user can move"):
        open_state_dir(shared / "job" / "state")
    assert not (shared / "job").exists()  # refused before anything was made


def test_a_group_writable_directory_on_the_way_is_refused(tmp_path: Path) -> None:
    _as_root()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    os.chown(shared, -1, NOBODY)  # a group this user shares with others
    with pytest.raises(TakeoverError, match=f"group {NOBODY}'s users can move or replace"):
        open_state_dir(shared / "state")


def test_a_sticky_directory_anyone_may_write_to_is_fine(tmp_path: Path) -> None:
    public = tmp_path / "public"
    public.mkdir()
    public.chmod(0o1777)  # as /tmp: nobody moves what another user made in it
    assert open_state_dir(public / "state") == public / "state"
    assert open_state_dir(tempfile.mkdtemp()).is_dir()


def test_a_link_another_user_owns_on_the_way_is_refused(tmp_path: Path) -> None:
    _as_root()
    (tmp_path / "mine").mkdir()
    link = tmp_path / "job"
    link.symlink_to(tmp_path / "mine")
    os.lchown(link, NOBODY, NOBODY)  # they choose where it leads
    with pytest.raises(TakeoverError, match=f"through the link '{link}', which uid {NOBODY} owns"):
        open_state_dir(link / "state")


def test_a_link_of_this_users_on_the_way_is_followed_and_its_target_checked(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "good").symlink_to("mine")
    (tmp_path / "bad").symlink_to(tmp_path / "open")
    assert open_state_dir(tmp_path / "good" / "state").is_dir()
    with pytest.raises(TakeoverError, match=r"is in '.*/open', which has mode 0777"):
        open_state_dir(tmp_path / "bad" / "state")


def test_a_directory_another_user_owns_on_the_way_is_refused(tmp_path: Path) -> None:
    _as_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(TakeoverError, match=f"belongs to uid {NOBODY}, who can move or replace"):
        open_state_dir(theirs / "state")


def test_a_state_directory_another_user_made_first_is_refused_with_what_to_do(
    tmp_path: Path,
) -> None:
    _as_root()
    squatted = tmp_path / "job-state"  # a fixed path under a sticky /tmp, made first
    squatted.mkdir(mode=0o700)
    os.chown(squatted, NOBODY, NOBODY)
    with pytest.raises(TakeoverError, match=r"made it first .*mkdtemp\(\) or mktemp -d"):
        open_state_dir(squatted)


def test_a_link_in_place_of_a_state_file_is_a_takeover_error(tmp_path: Path) -> None:
    root = open_state_dir(tmp_path / "state")
    (root / "journal").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TakeoverError, match="is a link; the state directory's files are never"):
        open_private(root / "journal", os.O_RDONLY)
