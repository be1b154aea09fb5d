"""Where built native libraries live, and the checks before one is loaded.

A library loaded with ctypes runs its constructors in this process, so a file someone else could
write must never be loaded. The cache directory (``$LOWBIT_CACHE/native``, default
``~/.cache/lowbit/native``) is used only when it is a real directory owned by this user and not
writable by group or others; otherwise lowbit warns once and builds into a private temporary
directory for this process instead. A cached library is loaded only when its SHA-256 equals the
one its build recorded next to it (``<name>.so.sha256``, written atomically after the library);
any other file (planted, truncated, missing record) is rebuilt. Temporary files come from
``tempfile.mkstemp`` in the target directory, so concurrent builds never share a name.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import warnings
from pathlib import Path

_private: Path | None = None


def configured_dir() -> Path:
    return Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit")) / "native"


def unsafe_reason(d: Path) -> str | None:
    """Why ``d`` must not hold libraries we load (None: it is safe)."""
    try:
        st = os.lstat(d)
    except OSError as e:
        return f"cannot stat it ({e})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir() -> Path:
    """This process's own build directory (mode 0700), made on first use."""
    global _private
    if _private is None or not _private.is_dir():
        _private = Path(tempfile.mkdtemp(prefix="lowbit-native-"))
    return _private


def library_dir() -> Path:
    """The directory to build into and load from: the configured cache if it is safe, else
    :func:`private_dir` (with a warning that says why)."""
    d = configured_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        pass
    why = unsafe_reason(d)
    if why is None:
        return d
    warnings.warn(f"lowbit: not loading native libraries from {d}: {why}; building them in a private "
                  "temporary directory instead (fix the directory to keep the cache)", RuntimeWarning, stacklevel=3)
    return private_dir()


def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def record_path(so: Path) -> Path:
    return so.with_name(so.name + ".sha256")


def verified(so: Path) -> bool:
    """Whether ``so`` is a regular file of ours whose content matches its build record."""
    try:
        st = os.lstat(so)
        want = record_path(so).read_text().strip()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    return sha256_file(so) == want


def temp_path(d: Path, suffix: str) -> Path:
    """A fresh, empty file in ``d`` (mkstemp: unique name, mode 0600) for an atomic write."""
    fd, name = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=suffix)
    os.close(fd)
    return Path(name)


def publish(tmp_so: Path, so: Path) -> None:
    """Move a finished build into place, then its SHA-256 record (each by an atomic rename): a
    reader that finds the record finds the library it describes, or rebuilds."""
    os.chmod(tmp_so, 0o700)  # the linker's mode follows the umask; only this user may change it
    digest = sha256_file(tmp_so)
    os.replace(tmp_so, so)
    rec = temp_path(so.parent, ".sha256")
    try:
        rec.write_text(digest + "\n")
        os.replace(rec, record_path(so))
    finally:
        rec.unlink(missing_ok=True)
