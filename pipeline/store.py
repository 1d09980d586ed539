"""Raw files on disk (docs/design.md §2, §3): create, append, truncate, read, and per-file locks.

Files are created with ``O_EXCL`` and their directory fsynced, appended with one ``write`` on
an ``O_APPEND`` descriptor followed by ``fsync``, and never opened through a symlink. Paths
are made only from server-made file ids, never from anything a client sent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import filelock

from pipeline import errors, forks

SUBDIRS = {"session": "sessions", "upload": "uploads", "external": "external"}
LOCK_STRIPES = 1024  #: lock files under <data>/.locks; a file maps to one by hash
_OPEN_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def relative_path(source_type: str, file_id: str) -> str:
    """Where a live file lives, relative to the data directory."""
    return f"raw/{SUBDIRS[source_type]}/{file_id}.md"


def _storage_error(action: str, path: Path, exc: OSError) -> errors.TransientError:
    """A failed file operation as a transient error; a full disk or quota is its own kind, so
    that appends stop being acknowledged until there is room (507)."""
    detail = f"cannot {action} {path}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return errors.InsufficientStorage(detail)
    return errors.StorageUnavailable(detail)


def checked(data_dir: Path, relative: str) -> Path:
    """``data_dir / relative``, refusing a symlink at any directory between the two: the files
    under ``raw/`` are the store's own, and a link out of it (to another volume, another
    user's files) must never be read or written through. The file itself is opened with
    ``O_NOFOLLOW`` by every function here."""
    _check_dirs(data_dir, Path(relative).parts[:-1])
    return data_dir / relative


def checked_dir(data_dir: Path, relative: str) -> Path:
    """:func:`checked` for a directory: none of ``relative``'s parts may be a symlink."""
    _check_dirs(data_dir, Path(relative).parts)
    return data_dir / relative


class CheckedDirs:
    """:func:`checked` for many files in a few directories (a batch's): each directory is
    checked once, the first time a path in it is asked for, not once a file."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._folders: dict[str, Path] = {}

    def path(self, relative: str) -> Path:
        """``data_dir / relative``, its directories checked as :func:`checked` does."""
        folder, _, name = relative.rpartition("/")
        found = self._folders.get(folder)
        if found is None:
            found = self._folders[folder] = checked_dir(self.data_dir, folder)
        return found / name


def _check_dirs(data_dir: Path, parts: tuple[str, ...]) -> None:
    path = data_dir
    for part in parts:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return  # made later by mkdir, which makes a real directory
        except OSError as exc:
            raise _storage_error("stat", path, exc) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise errors.FileDamaged(f"{path} is not a directory (a symlink?); refusing it")


def fsync_dir(path: Path) -> None:
    """Make a directory entry (a create, rename or unlink) durable."""
    _fsync(path, os.O_DIRECTORY, "fsync directory")


def fsync_file(path: Path, *, fd: int | None = None) -> None:
    """Make a file's content durable (one written with ``durable=False``); through ``fd``
    when the caller holds the file open (:class:`NewFile`), instead of opening it again."""
    if fd is None:
        _fsync(path, _OPEN_FLAGS, "fsync")
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _storage_error("fsync", path, exc) from exc


def _fsync(path: Path, flags: int, what: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _storage_error(what, path, exc) from exc


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the volume of ``path``."""
    try:
        st = os.statvfs(path)
    except FileNotFoundError:
        return free_bytes(path.parent) if path.parent != path else 0
    except OSError as exc:
        raise _storage_error("statvfs", path, exc) from exc
    return st.f_bavail * st.f_frsize


def probe(data_dir: Path) -> None:
    """Create, fsync and remove a file in ``data_dir`` (a health check); the error if any
    step fails. Each probe has a name of its own: concurrent checks never trip over each
    other."""
    path = data_dir / f".health-{uuid.uuid4().hex}"
    create(path, b"ok")
    remove(path, durable=False)


def size(path: Path) -> int | None:
    """The file's length, or None when it does not exist. A symlink is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _storage_error("stat", path, exc) from exc
    if not stat.S_ISREG(st.st_mode):
        raise errors.FileDamaged(f"{path} is not a regular file")
    return st.st_size


#: what makes an append durable: the data and the metadata needed to read it back (the new
#: length) but not the modification time, one journal write less than ``fsync`` where the
#: system has it
_datasync = getattr(os, "fdatasync", os.fsync)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def create(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data``, failing if it exists; durable on return."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _OPEN_FLAGS, 0o644)
    except OSError as exc:
        raise _storage_error("create", path, exc) from exc
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as exc:
        # Leave nothing half-written behind: the caller has not committed this file.
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise _storage_error("write", path, exc) from exc
    finally:
        os.close(fd)
    fsync_dir(path.parent)


def append(path: Path, data: bytes, *, expected_size: int) -> int:
    """Append ``data`` in one write and make it durable; returns the new length.

    The file must be exactly ``expected_size`` long; on any failure it is cut back to that
    length, as mailbox's ``_append_message`` does, so no partial block survives a failed call.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | _OPEN_FLAGS)
    except OSError as exc:
        raise _storage_error("open", path, exc) from exc
    try:
        current = os.fstat(fd).st_size
        if current != expected_size:
            raise errors.FileDamaged(
                f"{path} is {current} bytes, expected {expected_size} before appending"
            )
        try:
            _write_all(fd, data)
            _datasync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, expected_size)
                os.fsync(fd)
            raise _storage_error("append to", path, exc) from exc
        return expected_size + len(data)
    finally:
        os.close(fd)


def truncate(path: Path, length: int) -> None:
    """Cut ``path`` back to ``length`` bytes, durably."""
    try:
        fd = os.open(path, os.O_WRONLY | _OPEN_FLAGS)
        try:
            os.ftruncate(fd, length)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _storage_error("truncate", path, exc) from exc


def read(path: Path, length: int | None = None) -> bytes:
    """The file's bytes (the first ``length`` of them when given)."""
    with reader(path) as handle:
        return handle.read() if length is None else handle.read(length)


def read_range(path: Path, offset: int, length: int) -> bytes:
    """``length`` bytes of the file from ``offset`` (fewer at its end), read with ``pread``
    and nothing else."""
    handle = open_read(path)
    with handle:
        parts = []
        try:
            while length > 0:
                chunk = os.pread(handle.fileno(), length, offset)
                if not chunk:
                    break
                parts.append(chunk)
                offset += len(chunk)
                length -= len(chunk)
        except OSError as exc:
            raise _storage_error("read", path, exc) from exc
    return b"".join(parts)


def remove(path: Path, *, durable: bool = True) -> None:
    """Unlink ``path`` (if present); fsync its directory unless ``durable`` is false (for
    removals a crash may undo harmlessly)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _storage_error("remove", path, exc) from exc
    if durable:
        fsync_dir(path.parent)


class _Stripe:
    """One lock file as this process uses it: an in-process lock in front of its ``flock``.

    Threads wait on the in-process lock (no polling), and only its holder touches the lock
    file. That one tries ``flock`` without blocking on a descriptor kept open (about 1 µs),
    then checks that the path still names the file it has open (a removed ``.locks`` is made
    anew by the next process; a lock and its release take 3.7 µs with the check against 1.9
    without, ``timeit``); only when another process holds the file does it wait, through
    :mod:`filelock` (which polls and opens the path afresh). A :class:`filelock.FileLock`
    alone costs about 140 µs per acquire and release here, more than the rest of a
    one-message flush's own work.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.local = threading.RLock()
        self.depth = 0  #: how often the holding thread entered (the lock is re-entrant)
        self._fd: int | None = None
        self._waited: filelock.FileLock | None = None  #: holds the file after a wait

    def acquire(self, deadline: float) -> None:
        """Take the file's ``flock`` (the caller holds :attr:`local`)."""
        while True:
            if self._fd is None:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o644)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                break
            if self._current():
                return
            # removed or replaced since it was opened (``.locks`` cleaned up, a restore):
            # other processes lock the file there now, so this one must too
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.forget()
        waited = filelock.FileLock(self.path, thread_local=False, poll_interval=0.002)
        waited.acquire(timeout=max(0.0, deadline - time.monotonic()))
        self._waited = waited

    def _current(self) -> bool:
        """Whether the lock file at :attr:`path` is still the one the descriptor has open."""
        assert self._fd is not None
        try:
            there = os.lstat(self.path)
        except FileNotFoundError:
            return False
        here = os.fstat(self._fd)
        return (there.st_ino, there.st_dev) == (here.st_ino, here.st_dev)

    def release(self) -> None:
        if self._waited is not None:
            self._waited.release()
            self._waited = None
        elif self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def forget(self) -> None:
        """Close the descriptor without unlocking (in a forked child the parent may hold the
        lock through it, and a child must not share it)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


_KNOWN_FILES = 65_536  #: file ids whose stripe a :class:`LockFiles` remembers


class LockFiles:
    """The per-file locks of one data directory as this process holds them: a file maps to
    one of :data:`LOCK_STRIPES` lock files under ``<data>/.locks`` by hash, each with an
    in-process lock in front (:class:`_Stripe`). One per data directory and process (the
    runtime's): a second one still excludes the first, through ``flock``, only less cheaply."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._stripes: dict[str, _Stripe] = {}
        #: the stripe of each file id seen lately (at most :data:`_KNOWN_FILES`)
        self._of: dict[str, _Stripe] = {}
        self._guard = threading.Lock()
        forks.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A child forked while a thread held a stripe must not inherit it, nor the
        descriptors."""
        for stripe in self._stripes.values():
            stripe.forget()
        self._stripes, self._of = {}, {}
        self._guard = threading.Lock()

    def _stripe(self, file_id: str) -> _Stripe:
        known = self._of.get(file_id)  # a flush round asks twice a file, every round
        if known is not None:
            return known
        number = int(hashlib.sha256(file_id.encode()).hexdigest()[:8], 16) % LOCK_STRIPES
        path = str(self.data_dir / ".locks" / f"{number:04d}.lock")
        with self._guard:
            found = self._stripes.get(path)
            if found is None:
                found = self._stripes[path] = _Stripe(path)
            if len(self._of) >= _KNOWN_FILES:
                self._of.clear()
            self._of[file_id] = found
            return found

    @contextlib.contextmanager
    def lock(self, file_id: str, *, timeout: float, flock: bool = True) -> Iterator[None]:
        """Hold the per-file lock: an in-process lock, then (unless ``flock`` is off) the
        ``flock`` of the file's lock file, which other processes respect. With ``flock`` off
        only this process is kept out: other processes must be excluded otherwise
        (PostgreSQL's advisory lock: :mod:`pipeline.locks`)."""
        stripe = self._stripe(file_id)
        deadline = time.monotonic() + timeout
        if not stripe.local.acquire(timeout=timeout):
            raise errors.LockTimeout(f"lock for file {file_id} not acquired in {timeout}s")
        try:
            if flock and stripe.depth == 0:
                try:
                    stripe.acquire(deadline)
                except filelock.Timeout:
                    raise errors.LockTimeout(
                        f"lock for file {file_id} not acquired in {timeout}s"
                    ) from None
                except OSError as exc:
                    raise _storage_error("lock", Path(stripe.path), exc) from exc
            stripe.depth += 1
            try:
                yield
            finally:
                stripe.depth -= 1
                if flock and stripe.depth == 0:
                    stripe.release()
        finally:
            stripe.local.release()

    def close(self) -> None:
        """Close the lock files' descriptors (none may be held)."""
        with self._guard:
            stripes, self._stripes, self._of = self._stripes, {}, {}
        for stripe in stripes.values():
            stripe.forget()

    def order(self, file_ids: Iterable[str]) -> list[str]:
        """``file_ids`` in the order to lock several at once: by lock file, so two processes
        locking overlapping sets never wait for each other in a circle."""
        return sorted(file_ids, key=lambda file_id: (self._stripe(file_id).path, file_id))


@contextlib.contextmanager
def exclusive_writer(path: Path, *, durable: bool = True) -> Iterator[BinaryIO]:
    """A new file opened for writing (``O_EXCL``); fsynced on success (unless ``durable`` is
    false: then the caller syncs it with :func:`fsync_file`, before anything depends on it),
    removed on failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o644)
    except OSError as exc:
        raise _storage_error("create", path, exc) from exc
    handle = os.fdopen(fd, "wb")
    try:
        yield handle
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    except BaseException as exc:
        handle.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        if isinstance(exc, OSError):
            raise _storage_error("write", path, exc) from exc
        raise
    handle.close()


class NewFile:
    """A file created (``O_EXCL``) and written but not yet durable, its descriptor kept open
    so that it is read back, fsynced and closed without being opened again (the archive's
    temp files: each one verified, then fsynced with its batch before its rename). The
    caller closes it; on a failed write nothing is left behind."""

    def __init__(self, path: Path, data: bytes) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS
        try:
            try:
                fd = os.open(path, flags, 0o644)
            except FileNotFoundError:  # its directory: made when missing, not checked each time
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise _storage_error("create", path, exc) from exc
        try:
            _write_all(fd, data)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise _storage_error("write", path, exc) from exc
        self.path = path
        self.fd: int | None = fd
        self.size = len(data)

    def _open(self) -> int:
        if self.fd is None:
            raise errors.StorageUnavailable(f"{self.path} is already closed")
        return self.fd

    def read_back(self) -> bytes:
        """The file's bytes as the kernel now holds them, read with ``pread`` up to its end
        (one byte more than was written is asked for: a longer file shows)."""
        fd = self._open()
        parts = []
        offset = 0
        try:
            while True:
                chunk = os.pread(fd, self.size + 1 - offset, offset)
                if not chunk:
                    break
                parts.append(chunk)
                offset += len(chunk)
                if offset > self.size:
                    break
        except OSError as exc:
            raise _storage_error("read", self.path, exc) from exc
        return b"".join(parts)

    def sync(self) -> None:
        """Make the content durable (:func:`fsync_file` through the open descriptor)."""
        fsync_file(self.path, fd=self._open())

    def close(self) -> None:
        """Close the descriptor (again: nothing)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


def open_read(path: Path) -> BinaryIO:
    """The file opened for reading, never through a symlink; the caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        raise errors.NotFound(f"raw file {path} is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise errors.FileDamaged(f"{path} is a symlink; refusing to follow it") from None
        raise _storage_error("open", path, exc) from exc
    return os.fdopen(fd, "rb")


@contextlib.contextmanager
def reader(path: Path) -> Iterator[BinaryIO]:
    """The file opened for reading, never through a symlink."""
    with open_read(path) as handle:
        try:
            yield handle
        except OSError as exc:
            raise _storage_error("read", path, exc) from exc


def rename(src: Path, dst: Path, *, durable: bool = True) -> None:
    """Atomically move ``src`` to ``dst`` (same volume) and fsync the directories (unless
    ``durable`` is false: then the caller fsyncs them, once for many renames)."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, dst)
    except OSError as exc:
        raise _storage_error("rename", src, exc) from exc
    if durable:
        fsync_dir(dst.parent)
        if src.parent != dst.parent:
            fsync_dir(src.parent)


def exists(path: Path) -> bool:
    """Whether ``path`` exists (a symlink counts, so it is never silently replaced)."""
    return os.path.lexists(path)
