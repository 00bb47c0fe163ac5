"""Files that hold conversation or credentials are their owner's alone.

One rule everywhere lcm creates such a file (a SQLite store and its folder, a backup copy, the
``.bak`` that ``lcm doctor --repair`` keeps, an export, a host's ``.env`` with a database URL):
a file lcm creates is ``0600`` and a folder it creates ``0700``, whatever the umask; a file or
folder that already exists keeps its mode (the user chose it). Conversations hold secrets
(keys pasted into a chat, tokens in tool output), and a URL may hold a password.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

OWNER_FILE = 0o600
OWNER_DIR = 0o700


def private_dir(path: Path) -> None:
    """``path`` and its missing parents, the ones created owner-only (existing ones untouched)."""
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            folder.mkdir(mode=OWNER_DIR)
            folder.chmod(OWNER_DIR)  # mkdir's mode is masked by the umask


def create_private(path: Path) -> bool:
    """Create ``path`` empty and owner-only if it does not exist (its folder too); True when
    created. An existing file is left as it is."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_FILE)
    except FileExistsError:
        return False
    os.close(fd)
    os.chmod(path, OWNER_FILE)  # os.open's mode is masked by the umask
    return True


@contextmanager
def atomic_writer(path: Path, *, private: bool) -> Iterator[TextIO]:
    """Write ``path`` in one step: the text goes to a new file beside it, renamed over it when
    the block ends, removed when it fails (all or nothing: no partial file, ever). The new file
    keeps the mode of the one it replaces; a new file is owner-only when ``private``, else as
    the umask says."""
    mode = path.stat().st_mode & 0o777 if path.exists() else (OWNER_FILE if private else None)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.lcm-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else OWNER_FILE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            if mode is not None:
                os.chmod(tmp, mode)  # os.open's mode is masked by the umask
            yield out
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_atomic(path: Path, text: str, *, private: bool) -> None:
    """Replace ``path`` with ``text`` in one step (see :func:`atomic_writer`)."""
    with atomic_writer(path, private=private) as out:
        out.write(text)
