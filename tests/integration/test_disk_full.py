"""A full data volume (issue: hardening), on a real tmpfs of 1 MiB, with the index on SQLite
and on PostgreSQL: flushes fail with ENOSPC without leaving a torn byte, appends stop being
acknowledged (507 + Retry-After) until there is room, and once space is freed the backlog
drains in bounded chunks, every acknowledged message readable and fsck clean."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
from conftest import unavailable

from pipeline import database, errors, integrity, ledger, reader
from pipeline.settings import Backlog, Settings


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test."""
    path = tmp_path / "volume"
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs to fill: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(volume: Path, leave: int) -> Path:
    """A junk file that takes all but about ``leave`` bytes of the volume."""
    junk = volume / "junk"
    fd = os.open(junk, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            free = os.statvfs(volume).f_bavail * os.statvfs(volume).f_frsize
            if free <= leave:
                break
            try:
                os.write(fd, b"\0" * min(65536, free - leave))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    return junk


def test_a_full_disk_stops_acks_and_the_backlog_drains_after(
    volume: Path, db: database.Database, database_url: str
) -> None:
    data_dir = volume / "data"
    base = Settings(data_dir=data_dir, database_url=database_url)
    settings = dataclasses.replace(
        base,
        backlog=Backlog(min_free_bytes=16 * 1024, flush_chunk_bytes=20_000, retry_after=2),
    )
    service = helpers.service(db, settings)
    service.admission.REFRESH = 0
    sent: dict[str, list[str]] = {}
    for i in range(24):
        key = f"s{i % 3}"
        content = f"{key} message {i} " + "x" * 9000
        result = helpers.append(
            service,
            {
                "agent_id": "hermes",
                "session_key": key,
                "messages": [{"role": "user", "content": content}],
            },
        ).result
        sent.setdefault(result.file_id, []).append(content)
    with db.transaction() as conn:
        waiting = ledger.journal_backlog(conn)[2]
    assert waiting > 200_000

    junk = fill(volume, leave=50_000)
    for file_id in sent:
        with pytest.raises(errors.InsufficientStorage):
            service.flush(file_id)
    assert integrity.fsck(db, data_dir) == []  # what was committed is intact; no torn tail
    with pytest.raises(errors.InsufficientStorage) as refused:
        helpers.append(
            service,
            {
                "agent_id": "hermes",
                "session_key": "late",
                "messages": [{"role": "user", "content": "x"}],
            },
        )
    assert refused.value.status == 507 and refused.value.retry_after == 2

    junk.unlink()  # space is freed
    for file_id in sent:
        service.flush(file_id)
    with db.transaction() as conn:
        assert ledger.journal_backlog(conn) == (0, 0, 0)
    for file_id, contents in sent.items():
        found = reader.messages(db, data_dir, file_id, limit=1000)
        assert [m.content for m in found] == contents
    assert integrity.fsck(db, data_dir) == []
    late = helpers.append(
        service,
        {
            "agent_id": "hermes",
            "session_key": "late",
            "messages": [{"role": "user", "content": "x"}],
        },
        wait=True,
    )
    assert late.flushed
