"""Where apps leave their stacks for ``otpmesh stacks``: a directory only their user can enter.

The usual place is ``$XDG_RUNTIME_DIR/otpmesh-UID`` (a per-user directory the login manager
made), else ``otpmesh-UID`` in the temporary directory. There, another user can create that
name first (the uid is no secret), and a directory of theirs must never be used: a marker
planted in it would make ``otpmesh stacks`` signal a process that dies of SIGUSR2. So a
directory is trusted only when ``lstat`` says it is a real directory (no symlink), owned by this
user, with no access for group or others; and when the usual place is not, an app makes a fresh
one beside it with ``mkdtemp`` (``otpmesh-UID-XXXXXXXX``, mode 0700), which no one else can
have made, logs why, and the command looks in every trusted ``otpmesh-UID-*`` directory there
too. Another user can thus slow nothing down but a glob, and switches nothing off.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

#: Most fallback directories looked at (a user whose apps met a squatted usual place keeps
#: reusing the first one, so more than a few means someone else made them: none is trusted).
MAX_FALLBACKS = 16


def _base() -> Path:
    return Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())


def usual_dir() -> Path:
    """The usual place of this user's stacks directory (see the module docstring)."""
    return _base() / f"otpmesh-{os.getuid()}"


def why_untrusted(directory: Path) -> str | None:
    """Why `directory` is not a private directory of this user, or None when it is one (what
    is in another user's look-alike must not be trusted)."""
    try:
        st = directory.lstat()
    except FileNotFoundError:
        return "it does not exist"
    except OSError as exc:
        return f"it cannot be looked at ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return f"its mode {stat.S_IMODE(st.st_mode):#o} lets others in (0700 expected)"
    return None


def is_private(directory: Path) -> bool:
    return why_untrusted(directory) is None


def fallback_dirs() -> list[Path]:
    """This user's trusted ``otpmesh-UID-*`` directories beside the usual place, oldest name
    first (at most MAX_FALLBACKS of them). Others may make look-alike names there too: they are
    passed over before counting, so no number of them hides this user's own."""
    own = [path for path in _base().glob(f"otpmesh-{os.getuid()}-*") if is_private(path)]
    return sorted(own)[:MAX_FALLBACKS]


def trusted_dirs() -> list[Path]:
    """Every directory ``otpmesh stacks`` may read: the usual place if it is trusted, and the
    trusted fallbacks."""
    usual = usual_dir()
    return ([usual] if is_private(usual) else []) + fallback_dirs()


def make_private_dir() -> tuple[Path, str | None]:
    """The directory an app writes its stacks to, made if need be, and why it is not the usual
    place (None when it is): the usual place, else an existing fallback, else a new one."""
    usual = usual_dir()
    try:
        usual.mkdir(mode=0o700)
    except FileExistsError:
        pass
    why = why_untrusted(usual)
    if why is None:
        return usual, None
    why = f"{usual} is not a private directory of yours: {why}"
    existing = fallback_dirs()
    if existing:
        return existing[0], why
    return Path(tempfile.mkdtemp(prefix=f"otpmesh-{os.getuid()}-", dir=_base())), why
