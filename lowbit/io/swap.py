"""Put a finished folder in place of another in one step, and recognise what killed runs left.

A save writes into ``.tmp-lowbit-<pid>-*`` beside the target, then swaps it with the target by
``renameat2(RENAME_EXCHANGE)``: at every instant the target is either the whole old folder or the
whole new one. Where the kernel or file system cannot exchange, the old folder is moved aside to
``.old-lowbit-<pid>-*`` and moved back if the second rename fails. Folders with these prefixes
whose process is gone are stale: never loaded, and cleaned up by the next save beside them (an
old folder whose target is missing is renamed back).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path

from lowbit.io.atomic import fsync_dir

TEMP_PREFIXES = (".tmp-lowbit-", ".old-lowbit-")
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIXES)


def temp_prefix(kind: str = "tmp") -> str:
    """``.tmp-lowbit-<pid>-`` (or ``.old-``): the pid tells a live save from a killed one."""
    return f".{kind}-lowbit-{os.getpid()}-"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the system cannot (then nothing has moved)."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def publish_dir(new: Path, target: Path) -> None:
    """Make the finished folder ``new`` appear at ``target``; an existing ``target`` is deleted
    only after the new one is in place, and is back in place if anything fails before that. The
    parent folder is flushed after the rename, so the rename itself survives a power loss."""
    if not target.exists():
        os.replace(new, target)
    elif _exchange(new, target):
        shutil.rmtree(new)  # now holds the old folder
    else:
        old = target.parent / f"{temp_prefix('old')}{target.name}"
        os.rename(target, old)
        try:
            os.rename(new, target)
        except BaseException:
            os.rename(old, target)
            raise
        shutil.rmtree(old)
    fsync_dir(target.parent)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(p: Path) -> tuple[str, int | None, str]:
    """(kind, pid, rest) of a temporary folder name: ``.old-lowbit-12-q`` -> ("old", 12, "q")."""
    kind, _, tail = p.name[1:].partition("-lowbit-")
    pid, _, rest = tail.partition("-")
    return kind, int(pid) if pid.isdigit() else None, rest


def stale_temp_dirs(parent: Path) -> list[Path]:
    """Temporary folders in ``parent`` left by lowbit saves whose process no longer runs (those
    without a pid in their name, from older lowbit versions, are left to the user)."""
    out = []
    for p in sorted(parent.iterdir()) if parent.is_dir() else []:
        if p.is_dir() and is_temp_name(p.name):
            pid = _owner(p)[1]
            if pid is not None and not _pid_alive(pid):
                out.append(p)
    return out


def recover_stale_temp_dirs(parent: Path) -> None:
    """Put back an old checkpoint a killed swap left aside (its target missing); remove the rest."""
    for p in stale_temp_dirs(parent):
        kind, _, name = _owner(p)
        if kind == "old" and name and not (parent / name).exists():
            os.rename(p, parent / name)
        else:
            shutil.rmtree(p, ignore_errors=True)
