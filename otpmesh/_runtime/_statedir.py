"""A takeover's state directory: the lease, the fencing epoch and the journal.

The directory must be this user's alone: 0700, owned by this uid, and every file in it 0600;
anything else is refused, never repaired, since a directory another user could write to may
already hold their files. It holds no usable secret: the app's is in the journal only wrapped
under the user's key (_appkey.py).

- ``lease``: ``flock``ed by the active controller (_lease.py). The kernel releases it when the
  holder dies (SIGKILL included), which is what wakes a standby.
- ``epoch``: the fencing epoch, bumped by each controller that takes the lease, written to a
  temporary file, fsync'd, then renamed over the old one (never half written).
- ``journal``: one JSON record a line: the app record (its wrapped secret, its epoch), then each
  process, actor start and restart; compacted to what is still true as it grows
  (_journal.py). ``journal.new`` is a compaction's snapshot before its rename.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .._core._errors import TakeoverError
from ._appkey import wrap

LEASE, EPOCH, JOURNAL, FORKSERVER_SOCKET = "lease", "epoch", "journal", "forkserver.sock"
_PRIVATE_FILE = 0o600


def open_state_dir(path: str | os.PathLike[str]) -> Path:
    """The state directory at `path`, made (0700) if missing, checked to be this user's alone,
    on a route no other user can redirect (``check_route``)."""
    root = Path(path).absolute()
    check_route(root)
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise TakeoverError(
            f"takeover: cannot make the state directory {str(root)!r}: {exc}"
        ) from None
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise TakeoverError(f"takeover: {str(root)!r} is not a directory (a link is refused too)")
    if st.st_uid != os.getuid():
        raise TakeoverError(
            f"takeover: the state directory {str(root)!r} belongs to uid {st.st_uid}, not to "
            f"this user (uid {os.getuid()}); it holds the app's secret, and another user who "
            f"made it first keeps this job from starting: {_OWN_PATH}"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise TakeoverError(
            f"takeover: the state directory {str(root)!r} has mode "
            f"{stat.S_IMODE(st.st_mode):04o}; it holds the app's secret, so it must be 0700: "
            f"chmod 700 {str(root)!r}"
        )
    return root


_OWN_PATH = (
    "give it a path only you can make, e.g. under your home directory, or one made by "
    "tempfile.mkdtemp() or mktemp -d and passed to the standby too"
)
#: How many links a route may go through (the kernel's own limit, MAXSYMLINKS).
_MAX_LINKS = 40


def check_route(root: Path) -> None:
    """Refuse a state directory whose route another user could redirect or swap: a link they
    own on the way (they choose where it leads), or a directory on the way that they own or
    may write to without the sticky bit (they can move what is in it and put theirs in its
    place). Root's directories and /tmp (sticky) are safe; what does not exist yet is made by
    this user."""
    me, here, todo, links = os.getuid(), Path(root.anchor), list(root.parts[1:-1]), 0
    _check_dir(root, here, os.lstat(here))
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        step = here.parent if part == ".." else here / part
        try:
            st = os.lstat(step)
            target = Path(os.readlink(step)) if stat.S_ISLNK(st.st_mode) else None
        except OSError:
            return  # missing (made by this user), or mkdir says what is wrong
        if target is not None:
            links += 1
            if links > _MAX_LINKS:
                return  # mkdir says so (ELOOP)
            if st.st_uid not in (0, me):
                raise TakeoverError(
                    f"takeover: the state directory {str(root)!r} is reached through the link "
                    f"{str(step)!r}, which uid {st.st_uid} owns and can point anywhere: "
                    f"{_OWN_PATH}"
                )
            todo[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
            here = Path(target.anchor) if target.is_absolute() else here
            continue
        if not stat.S_ISDIR(st.st_mode):
            return  # mkdir says what is wrong
        here = step
        _check_dir(root, here, st)


def _check_dir(root: Path, directory: Path, st: os.stat_result) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.getuid()):
        why = f"belongs to uid {st.st_uid}, who can move or replace what is in it"
    elif mode & 0o002 and not mode & stat.S_ISVTX:
        why = f"has mode {mode:04o}: any user can move or replace what is in it"
    elif mode & 0o020 and not mode & stat.S_ISVTX and not _private_group(st.st_gid):
        why = f"has mode {mode:04o}: group {st.st_gid}'s users can move or replace what is in it"
    else:
        return
    raise TakeoverError(
        f"takeover: the state directory {str(root)!r} is in {str(directory)!r}, which {why}: "
        f"{_OWN_PATH}"
    )


def _private_group(gid: int) -> bool:
    """Whether group `gid` is this user's private group (a umask of 002 makes directories
    group-writable, which is safe there): named after the user, with no other member."""
    try:
        name = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getgid() and group.gr_name == name and set(group.gr_mem) <= {name}


def open_private(path: Path, flags: int) -> int:
    """Open `path` (made 0600 if missing); refuse a link, another owner or a wider mode."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _PRIVATE_FILE)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise TakeoverError(
            f"takeover: {str(path)!r} is a link; the state directory's files are never followed "
            "anywhere: remove it and start again"
        ) from None
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise TakeoverError(
            f"takeover: {str(path)!r} must be this user's and mode 0600, not uid {st.st_uid} "
            f"mode {stat.S_IMODE(st.st_mode):04o}; remove it and start again"
        )
    return fd


def read_epoch(root: Path) -> int:
    """The fencing epoch in the directory (0 before the first controller's)."""
    path = root / EPOCH
    if not path.exists():
        return 0
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd) as f:
        text = f.read().strip()
    return int(text) if text.isdigit() else 0


def boot_id() -> str:
    """This host's boot (Linux's boot_id): monotonic times taken under one boot compare across
    processes, whatever the wall clock did; "" where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def fsync_dir(root: Path) -> None:
    """Make a rename in the directory `root` durable."""
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def epoch_lock(root: Path) -> Iterator[None]:
    """Hold the directory's epoch still: a new epoch is not written meanwhile (a compaction
    checks that the journal is still its controller's and renames under it)."""
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(dir_fd)


def bump_epoch(root: Path) -> int:
    """Read the fencing epoch, write it plus one durably, and return the new one; TakeoverError
    if it cannot be written (a full disk: nothing was fenced, nothing taken over)."""
    with epoch_lock(root):
        try:
            return _bump_epoch(root)
        except OSError as exc:
            raise TakeoverError(
                f"takeover: cannot write the fencing epoch in {str(root)!r}: {exc}; make room "
                "on its file system (or give Takeover(dir=...) another one) and start again"
            ) from None


def _bump_epoch(root: Path) -> int:
    path = root / EPOCH
    new = read_epoch(root) + 1
    tmp = root / f"{EPOCH}.new"
    tmp.unlink(missing_ok=True)
    fd = open_private(tmp, os.O_WRONLY | os.O_EXCL)
    with os.fdopen(fd, "w") as f:
        f.write(f"{new}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(root)
    return new


class Placed(Protocol):
    """What the journal records of a worker process (the runtime's ``Proc``)."""

    proc_id: str
    pid: int
    addr: str
    rank: int
    coords: dict[str, int]


class Appends(Protocol):
    """The journal, as a takeover state writes it (_journal.py's ``Journal``)."""

    def append(self, record: dict[str, Any], *, durable: bool = False) -> None: ...
    def close(self) -> None: ...


@dataclass(eq=False)
class TakeoverState:
    """What a controller run with a takeover keeps: its state directory, grace and epoch."""

    root: Path
    grace: float
    epoch: int
    journal: Appends

    def for_fork_server(self, secret: bytes) -> dict[str, Any]:
        return {
            "socket": str(self.root / FORKSERVER_SOCKET),
            "lease": str(self.root / LEASE),
            "epoch_file": str(self.root / EPOCH),
            "grace": self.grace,
            "secret": secret,
            "epoch": self.epoch,
        }

    def for_worker(self, proc_id: str) -> dict[str, Any]:
        output = str(self.root / f"{proc_id}.out")
        lease = str(self.root / LEASE)
        return {
            "epoch": self.epoch,
            "takeover": {"grace": self.grace, "output": output, "lease": lease},
        }

    def app_started(
        self, secret: bytes, key: bytes, fingerprint: dict[str, Any] | None = None
    ) -> None:
        """The record a standby starts from: fsync'd, it must survive whatever comes next. The
        app's secret is in it only wrapped under `key` (_appkey.py); the tree's and its code's
        `fingerprint`, for a standby to compare (_controller/_fingerprint.py)."""
        record = {"app": os.getpid(), "epoch": self.epoch, **wrap(key, secret), "boot": boot_id()}
        if fingerprint is not None:
            record["fingerprint"] = fingerprint
        self.journal.append(record, durable=True)

    def proc_started(self, proc: Placed) -> None:
        self.journal.append(
            {
                "proc": proc.proc_id,
                "pid": proc.pid,
                "addr": proc.addr,
                "rank": proc.rank,
                "coords": proc.coords,
            }
        )

    def actor_started(self, path: str, incarnation: int, proc: Placed) -> None:
        self.journal.append({"actor": path, "incarnation": incarnation, "proc": proc.proc_id})

    def proc_exited(self, proc: Placed) -> None:
        self.journal.append({"exited": proc.proc_id})

    def agent_token(self, rank: int, next_token: bytes, presented: bytes | None) -> None:
        """The tokens of rank `rank`'s agent: the one it holds for its next registration, the
        one it presented last. Not fsync'd, as a process record: a controller's death does not
        lose a write, and a standby reads them to register only those agents."""
        record: dict[str, Any] = {"agent_token": rank, "next": next_token.hex()}
        if presented is not None:
            record["presented"] = presented.hex()
        self.journal.append(record)

    def restarted(
        self, sup_path: str, at: float, mono: float | None, window: int | None = None
    ) -> None:
        """A restart by the supervisor at `sup_path`, at `at` (wall-clock seconds) and `mono`
        (``time.monotonic()``; the next controller's trio clock is another); `window`: how many
        of its restarts, this one included, are inside its intensity period now (None:
        unknown, all are kept)."""
        record: dict[str, Any] = {"restart": sup_path, "at": at}
        if mono is not None:
            record["mono"] = mono
        if window is not None:
            record["window"] = window
        self.journal.append(record)

    def tree_changed(self, record: dict[str, Any]) -> None:
        """A supervisor's child list, or what changed in it (_core/_livetree.py's records).
        Not fsync'd: a controller's death loses no write, and the journal's fold takes the
        last whole operation it holds."""
        self.journal.append(record)

    def stopped(self) -> None:
        self.journal.append({"stopped": os.getpid()}, durable=True)
