"""Raw files on disk (:mod:`pipeline.store`): mailbox discipline — ``O_EXCL`` create, appends
that are all there or cut back, no symlinks — and the per-file lock files."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from pipeline import errors, store


def test_create_refuses_an_existing_file_and_leaves_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "raw" / "sessions" / "a.md"
    store.create(path, b"first")
    with pytest.raises(errors.StorageUnavailable):
        store.create(path, b"second")
    assert path.read_bytes() == b"first"


def test_append_needs_the_expected_length(tmp_path: Path) -> None:
    path = tmp_path / "a.md"
    store.create(path, b"12345")
    assert store.append(path, b"678", expected_size=5) == 8
    with pytest.raises(errors.FileDamaged, match="expected 5"):
        store.append(path, b"9", expected_size=5)
    assert path.read_bytes() == b"12345678"


def test_nothing_is_read_or_written_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.md"
    target.write_bytes(b"not ours")
    link = tmp_path / "a.md"
    link.symlink_to(target)
    with pytest.raises(errors.FileDamaged, match="symlink"):
        store.read(link)
    with pytest.raises(errors.FileDamaged, match="not a regular file"):
        store.size(link)
    linked_dir = tmp_path / "data" / "raw"
    linked_dir.parent.mkdir()
    linked_dir.symlink_to(tmp_path)
    with pytest.raises(errors.FileDamaged, match="not a directory"):
        store.checked(tmp_path / "data", "raw/sessions/x.md")
    assert target.read_bytes() == b"not ours"


def test_truncate_and_read_range(tmp_path: Path) -> None:
    path = tmp_path / "a.md"
    store.create(path, b"0123456789")
    assert store.read_range(path, 2, 3) == b"234"
    assert store.read_range(path, 8, 10) == b"89"  # fewer at the end
    store.truncate(path, 4)
    assert store.read(path) == b"0123"


def test_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    store.probe(tmp_path)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(errors.StorageUnavailable):
        store.probe(tmp_path / "file")  # not a directory


def test_a_file_lock_excludes_other_holders_and_is_reentrant(tmp_path: Path) -> None:
    mine, theirs = store.LockFiles(tmp_path), store.LockFiles(tmp_path)
    with mine.lock("f1", timeout=1), mine.lock("f1", timeout=1):  # re-entrant in one thread
        # another holder (another process's, here another set of lock files) waits, then
        # gives up: flock excludes whoever holds the same lock file
        with pytest.raises(errors.LockTimeout), theirs.lock("f1", timeout=0.2):
            pass
        # and so does another thread of this process
        refused: list[BaseException] = []

        def other_thread() -> None:
            try:
                with mine.lock("f1", timeout=0.2):
                    pass
            except errors.LockTimeout as exc:
                refused.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(5)
        assert len(refused) == 1
    with theirs.lock("f1", timeout=1):  # free again
        pass


def test_a_lock_file_removed_under_a_long_running_holder_still_excludes(tmp_path: Path) -> None:
    # A process keeps its lock files open. If `.locks` is removed (an operator's cleanup, a
    # restore), the next process makes new lock files: the first must lock those too, not
    # the removed ones it still holds open, or the two would write one file at once.
    server, cli = store.LockFiles(tmp_path), store.LockFiles(tmp_path)
    with server.lock("f1", timeout=1):  # its descriptor on the lock file is kept
        pass
    shutil.rmtree(tmp_path / ".locks")
    # the other makes the lock file anew and holds it
    with (
        cli.lock("f1", timeout=1),
        pytest.raises(errors.LockTimeout),
        server.lock("f1", timeout=0.2),
    ):
        pass
    # free again, and taken on the lock file now there
    with (
        server.lock("f1", timeout=1),
        pytest.raises(errors.LockTimeout),
        cli.lock("f1", timeout=0.2),
    ):
        pass


def test_lock_order_is_the_same_for_everyone(tmp_path: Path) -> None:
    ids = [f"file-{i}" for i in range(20)]
    a, b = store.LockFiles(tmp_path), store.LockFiles(tmp_path)
    assert a.order(ids) == b.order(list(reversed(ids)))


def test_a_new_file_is_read_back_synced_and_closed_through_one_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "raw" / "archive" / "2026-03" / ".a.md.zst.tmp"
    written = store.NewFile(path, b"12345")  # its directory made on the way
    try:
        assert written.read_back() == b"12345"
        with path.open("ab") as other:
            other.write(b"6")
        assert written.read_back() == b"123456"  # what the file holds, longer shows
        written.sync()
    finally:
        written.close()
    written.close()  # again: nothing
    with pytest.raises(errors.StorageUnavailable, match="closed"):
        written.sync()
    with pytest.raises(errors.StorageUnavailable):
        store.NewFile(path, b"again")  # O_EXCL
    assert path.read_bytes() == b"123456"


def test_checked_dirs_checks_each_directory_as_checked_does(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "raw" / "sessions").mkdir(parents=True)
    paths = store.CheckedDirs(data)
    assert paths.path("raw/sessions/a.md") == store.checked(data, "raw/sessions/a.md")
    assert paths.path("raw/sessions/b.md") == data / "raw" / "sessions" / "b.md"
    (data / "raw" / "archive").symlink_to(tmp_path)
    with pytest.raises(errors.FileDamaged, match="not a directory"):
        paths.path("raw/archive/2026-03/a.md.zst")
