"""fsck detects every edit made behind the index's back; reindex rebuilds the index from the
files alone (docs/design.md §3 hash chain, §7 "the files are the truth")."""

from __future__ import annotations

import itertools
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline import (
    anomalies,
    catalog,
    database,
    document,
    flush,
    index,
    integrity,
    journal,
    locks,
    tables,
    terms,
)
from pipeline.settings import Reindex

TS = [f"2026-08-03T11:18:0{i}Z" for i in range(1, 10)]


def make_files(db: database.Database, data_dir: Path) -> dict[str, str]:
    """Two sessions (blocks of distinct lengths, written by two appends each), an external
    thread and an upload, all flushed: ``{name: file_id}``."""
    ids: dict[str, str] = {}
    for name, source_type in (
        ("target", "session"),
        ("bystander", "session"),
        ("external", "external"),
    ):
        first = journal.ingest(
            db,
            {
                "agent_id": "hermes",
                "session_key": f"{name}-key",
                "source_type": source_type,
                "metadata": {"app": "desk", "n": 3, "tags": ["a", "b"], "nested": {"x": 1.5}},
                "messages": [
                    {"role": "user", "content": "alpha", "ts": TS[0]},
                    {"role": "assistant", "content": "bravo bravo", "ts": TS[1]},
                ],
            },
        )
        journal.flush(db, data_dir, first.file_id)
        journal.ingest(
            db,
            {
                "agent_id": "hermes",
                "session_key": f"{name}-key",
                "source_type": source_type,
                "messages": [
                    {
                        "role": "tool",
                        "tool_name": "grep",
                        "content": "charlie\n# x user",
                        "ts": TS[2],
                    },
                    {"role": "user", "content": "delta delta delta", "ts": TS[3]},
                ],
            },
        )
        journal.flush(db, data_dir, first.file_id)
        ids[name] = first.file_id
    upload = journal.ingest_upload(
        db, {"agent_id": "hermes", "filename": "doc.md", "content": "# Title\n\nbody text\n"}
    )
    journal.flush(db, data_dir, upload.file_id)
    ids["upload"] = upload.file_id
    return ids


def path_of(db: database.Database, data_dir: Path, file_id: str) -> Path:
    with db.transaction() as conn:
        row = index.get_file(conn, file_id)
    assert row is not None
    return data_dir / row.path


def blocks_of(data: bytes) -> tuple[bytes, list[bytes]]:
    """(everything before the first block, the blocks)."""
    _, starts = document.block_offsets(data)
    bounds = [*starts, len(data)]
    return data[: starts[0]], [data[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def fsck_anomalies(db: database.Database) -> list[tuple[str | None, str]]:
    with db.transaction() as conn:
        return [(a.file_id, a.kind) for a in anomalies.listed(conn) if a.kind.startswith("fsck_")]


def test_fsck_is_clean_on_untouched_files(db: database.Database, data_dir: Path) -> None:
    make_files(db, data_dir)
    # a file acknowledged but never flushed has nothing on disk to check yet
    journal.ingest(
        db,
        {"agent_id": "a", "session_key": "later", "messages": [{"role": "user", "content": "x"}]},
    )
    assert integrity.fsck(db, data_dir) == []
    assert fsck_anomalies(db) == []


# Each tampering edits the target's bytes and names the problem kinds fsck must report: exactly
# these when ``exact``, at least these otherwise.
Tamper = Callable[[bytes], bytes]


def _change_body_byte(data: bytes) -> bytes:
    assert data.count(b"bravo bravo") == 1
    return data.replace(b"bravo bravo", b"bravo brave")


def _delete_block(data: bytes) -> bytes:
    prefix, blocks = blocks_of(data)
    return prefix + b"".join(blocks[:1] + blocks[2:])


def _swap_blocks(data: bytes) -> bytes:
    prefix, blocks = blocks_of(data)
    assert blocks[1].startswith(b"## ") and blocks[2].startswith(b"## ")
    return prefix + b"".join([blocks[0], blocks[2], blocks[1], blocks[3]])


def _change_role(data: bytes) -> bytes:
    # same length, so only the chain can notice
    heading = f"## {TS[3]} user\n".encode()
    assert data.count(heading) == 1
    return data.replace(heading, f"## {TS[3]} tool\n".encode())


def _change_time(data: bytes) -> bytes:
    heading = f"## {TS[1]} assistant\n".encode()
    assert data.count(heading) == 1
    return data.replace(heading, f"## {TS[4]} assistant\n".encode())


def _time_that_is_no_time(data: bytes) -> bytes:
    heading = f"## {TS[1]} assistant\n".encode()
    assert data.count(heading) == 1
    return data.replace(heading, heading.replace(b"2026-08-03", b"2026-13-03"))


def _insert_copy(data: bytes) -> bytes:
    prefix, blocks = blocks_of(data)
    return prefix + b"".join([blocks[0], blocks[1], blocks[1], *blocks[2:]])


def _replay_last_block(data: bytes) -> bytes:
    _, blocks = blocks_of(data)
    return data + blocks[-1]


def _change_session_key(data: bytes) -> bytes:
    assert data.count(b'"target-key"') == 1
    return data.replace(b'"target-key"', b'"targex-key"')


def _break_frontmatter(data: bytes) -> bytes:
    assert data.startswith(b"---\n")
    return b"+++\n" + data[4:]


def _invalid_utf8(data: bytes) -> bytes:
    at = data.index(b"alpha")
    return data[:at] + b"\xff" + data[at + 1 :]


TAMPERINGS: dict[str, tuple[Tamper, set[str], bool]] = {
    "change-a-body-byte": (_change_body_byte, {"chain_mismatch"}, True),
    "cut-the-tail": (lambda d: d[:-3], {"truncated", "chain_mismatch"}, True),
    "cut-a-whole-block": (
        lambda d: d[: len(d) - len(blocks_of(d)[1][-1])],
        {"truncated", "message_count", "chain_mismatch"},
        True,
    ),
    "delete-a-block": (_delete_block, {"truncated", "message_count", "chain_mismatch"}, True),
    "swap-two-blocks": (_swap_blocks, {"chain_mismatch"}, True),
    "change-a-heading-role": (_change_role, {"chain_mismatch"}, True),
    "change-a-heading-time": (_change_time, {"chain_mismatch"}, True),
    "a-heading-time-that-is-no-time": (_time_that_is_no_time, {"chain_mismatch"}, False),
    "insert-a-copied-block": (_insert_copy, {"uncommitted_tail", "chain_mismatch"}, False),
    "replay-the-last-block": (_replay_last_block, {"uncommitted_tail"}, True),
    "append-bytes": (lambda d: d + b"trailing junk\n", {"uncommitted_tail"}, True),
    "append-a-valid-block": (
        lambda d: d + f"## {TS[8]} user\n\nforged\n\n".encode(),
        {"uncommitted_tail"},
        True,
    ),
    "change-the-frontmatter": (_change_session_key, {"chain_mismatch", "header_mismatch"}, True),
    "break-the-frontmatter": (_break_frontmatter, {"format_error"}, True),
    "invalid-utf8": (_invalid_utf8, {"chain_mismatch", "format_error"}, True),
    "empty-the-file": (lambda d: b"", {"truncated"}, False),
}


@pytest.mark.parametrize("name", TAMPERINGS)
def test_fsck_reports_each_tampering(db: database.Database, data_dir: Path, name: str) -> None:
    tamper, kinds, exact = TAMPERINGS[name]
    ids = make_files(db, data_dir)
    target = ids["target"]
    path = path_of(db, data_dir, target)
    original = path.read_bytes()
    edited = tamper(original)
    assert edited != original
    path.write_bytes(edited)

    problems = integrity.fsck(db, data_dir)
    assert {p.file_id for p in problems} == {target}  # nobody else is blamed
    found = {p.kind for p in problems}
    if exact:
        assert found == kinds
    else:
        assert found >= kinds
    assert all(p.detail for p in problems)
    assert sorted(fsck_anomalies(db)) == sorted((target, f"fsck_{p.kind}") for p in problems)
    # fsck only reports
    assert path.read_bytes() == edited


def test_fsck_reports_a_changed_upload(db: database.Database, data_dir: Path) -> None:
    ids = make_files(db, data_dir)
    path = path_of(db, data_dir, ids["upload"])
    path.write_bytes(path.read_bytes().replace(b"body text", b"body texT"))
    problems = integrity.fsck(db, data_dir)
    assert [(p.file_id, p.kind) for p in problems] == [(ids["upload"], "chain_mismatch")]


def test_fsck_reports_a_deleted_file(db: database.Database, data_dir: Path) -> None:
    ids = make_files(db, data_dir)
    path_of(db, data_dir, ids["external"]).unlink()
    problems = integrity.fsck(db, data_dir)
    assert [(p.file_id, p.kind) for p in problems] == [(ids["external"], "missing")]
    assert fsck_anomalies(db) == [(ids["external"], "fsck_missing")]


def test_fsck_reports_an_unknown_file(db: database.Database, data_dir: Path) -> None:
    ids = make_files(db, data_dir)
    stray = data_dir / "raw" / "sessions" / f"{uuid.uuid4()}.md"
    shutil.copyfile(path_of(db, data_dir, ids["target"]), stray)
    (data_dir / "raw" / "sessions" / "notes.txt").write_text("not an .md file, ignored")
    problems = integrity.fsck(db, data_dir)
    assert [(p.file_id, p.kind) for p in problems] == [(stray.stem, "not_indexed")]
    assert fsck_anomalies(db) == [(stray.stem, "fsck_not_indexed")]


def test_fsck_reports_several_files_at_once(db: database.Database, data_dir: Path) -> None:
    ids = make_files(db, data_dir)
    path_of(db, data_dir, ids["target"]).write_bytes(
        _swap_blocks(path_of(db, data_dir, ids["target"]).read_bytes())
    )
    with path_of(db, data_dir, ids["bystander"]).open("ab") as handle:
        handle.write(b"x")
    problems = integrity.fsck(db, data_dir)
    assert sorted((p.file_id, p.kind) for p in problems) == sorted(
        [(ids["target"], "chain_mismatch"), (ids["bystander"], "uncommitted_tail")]
    )


# ---------------------------------------------------------------------------------------------
# reindex

KEPT = (
    "file_id",
    "path",
    "source_type",
    "agent_id",
    "session_key",
    "started_at",
    "ended_at",
    "next_seq",
    "flushed_seq",
    "flushed_bytes",
    "chain_head",
)


def snapshot(db: database.Database) -> dict[str, dict[str, object]]:
    with db.transaction() as conn:
        rows = index.list_files(conn, limit=1000)
    return {r.file_id: {**{k: getattr(r, k) for k in KEPT}, "metadata": r.metadata} for r in rows}


def test_reindex_rebuilds_raw_files_from_the_files_alone(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    ids = make_files(db, data_dir)
    before = snapshot(db)
    assert set(before) == set(ids.values())

    with db.transaction() as conn:
        conn.execute(sa.delete(tables.append_keys))
        catalog.clear(conn)  # the message catalog goes with the index
        conn.execute(sa.delete(tables.raw_files))
    assert snapshot(db) == {}

    report = integrity.reindex(db, file_locks, data_dir)
    assert (report.scanned, report.inserted, report.updated, report.failed) == (4, 4, 0, [])
    assert snapshot(db) == before
    with db.transaction() as conn:
        statuses = {r.status for r in index.list_files(conn)}
    assert statuses == {"new"}
    assert integrity.fsck(db, data_dir) == []

    # the rebuilt index routes the next append of a session to its old file, after its last seq
    again = journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "target-key",
            "messages": [{"role": "user", "content": "echo", "ts": TS[5]}],
        },
    )
    assert again.source_refs == (f"{ids['target']}:5",)
    journal.flush(db, data_dir, again.file_id)
    text = path_of(db, data_dir, ids["target"]).read_text()
    doc = document.parse(text, file_id=ids["target"])
    assert [m.content for m in doc.messages] == [
        "alpha",
        "bravo bravo",
        "charlie\n# x user",
        "delta delta delta",
        "echo",
    ]
    assert integrity.fsck(db, data_dir) == []


def test_reindex_over_an_existing_index_changes_nothing_and_flushes_the_journal(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    ids = make_files(db, data_dir)
    pending = journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "bystander-key",
            "messages": [{"role": "user", "content": "late", "ts": TS[6]}],
        },
    )
    before = snapshot(db)
    report = integrity.reindex(db, file_locks, data_dir)
    assert (report.scanned, report.inserted, report.updated, report.failed) == (4, 0, 4, [])
    after = snapshot(db)
    assert after[ids["bystander"]]["flushed_seq"] == 5
    assert flush.stale_files(db, age=0) == []
    changed = {fid for fid in before if before[fid] != after[fid]}
    assert changed == {pending.file_id}
    assert integrity.fsck(db, data_dir) == []


def _found(db: database.Database) -> dict[str, list[tuple[object, ...]]]:
    """What a search for each word of the test files finds: ``(file_id, seq, role)``."""
    found: dict[str, list[tuple[object, ...]]] = {}
    with db.reading() as conn:
        for word in ("alpha", "bravo", "charlie", "delta", "hermes", "x"):
            hits = catalog.find(conn, terms.parse_query(word), catalog.Filters(), limit=100)
            found[word] = sorted((h.message.file_id, h.message.seq, h.message.role) for h in hits)
        for role in ("user", "assistant"):
            hits = catalog.find(
                conn, terms.parse_query("bravo"), catalog.Filters(role=role), limit=100
            )
            found[f"bravo/{role}"] = sorted((h.message.file_id, h.message.seq) for h in hits)
    return found


def _catalog(db: database.Database) -> list[tuple[object, ...]]:
    m = tables.messages.c
    with db.reading() as conn:
        rows = conn.execute(
            sa.select(m.file_id, m.seq, m.byte_offset, m.byte_length, m.ts, m.role, m.tool_name)
        )
        return sorted(tuple(r) for r in rows)


def test_reindex_in_batches_by_worker_processes_makes_what_the_flushes_made(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    """The same file rows, catalog rows and search terms as the incremental flushes, with the
    files read by a pool of processes and written a batch per commit."""
    make_files(db, data_dir)
    before, rows, searched = snapshot(db), _catalog(db), _found(db)
    assert searched["bravo"] and searched["bravo/assistant"] and not searched["bravo/user"]
    with db.transaction() as conn:
        conn.execute(sa.delete(tables.append_keys))
        catalog.clear(conn)
        conn.execute(sa.delete(tables.raw_files))
    seen: list[int] = []

    options = Reindex(batch_files=1, workers=2)  # 4 files: more than a batch, so a pool
    report = integrity.reindex(db, file_locks, data_dir, options, progress=seen.append)
    assert (report.scanned, report.inserted, report.updated, report.failed) == (4, 4, 0, [])
    assert sum(seen) == 4
    assert snapshot(db) == before
    assert _catalog(db) == rows
    assert _found(db) == searched
    assert integrity.fsck(db, data_dir) == []


def test_reindex_reports_a_heading_whose_time_is_no_time_and_goes_on(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    """A heading the format's pattern takes but whose date does not exist (a hand edit: month
    13) makes its file unreadable to ``reindex``, which rebuilds the other files."""
    ids = make_files(db, data_dir)
    path = path_of(db, data_dir, ids["target"])
    path.write_bytes(_time_that_is_no_time(path.read_bytes()))
    with db.transaction() as conn:
        conn.execute(sa.delete(tables.append_keys))
        catalog.clear(conn)
        conn.execute(sa.delete(tables.raw_files))

    report = integrity.reindex(db, file_locks, data_dir)
    assert (report.scanned, report.inserted, report.updated) == (4, 3, 0)
    assert [(p.file_id, p.kind) for p in report.failed] == [
        (ids["target"], integrity.Finding.UNREADABLE)
    ]
    assert "2026-13-03T11:18:02Z" in report.failed[0].detail
    with db.reading() as conn:
        kinds = [(a.file_id, a.kind) for a in anomalies.listed(conn)]
    assert (ids["target"], "reindex_unreadable") in kinds
    with db.reading() as conn:
        assert sorted(r.file_id for r in index.list_files(conn)) == sorted(
            file_id for name, file_id in ids.items() if name != "target"
        )


def test_the_catalog_made_from_the_files_skips_a_heading_whose_time_is_no_time(
    db: database.Database, data_dir: Path
) -> None:
    """What the migrations that make the catalog run (``integrity.catalog_all``): a file with
    such a heading is counted as unreadable and gets no rows; the others are cataloged."""
    ids = make_files(db, data_dir)
    path = path_of(db, data_dir, ids["target"])
    path.write_bytes(_time_that_is_no_time(path.read_bytes()))
    with db.transaction() as conn:
        catalog.clear(conn)
        assert integrity.catalog_all(conn, data_dir) == (3, 1)
        cataloged = {r.file_id for r in conn.execute(sa.select(tables.messages.c.file_id))}
    assert cataloged == {file_id for name, file_id in ids.items() if name != "target"}
