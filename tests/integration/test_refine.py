"""Refinement on a real index (docs/design.md §4), on SQLite and PostgreSQL: due files, the claim
and its lease, the fenced commit, appends during a refine, retries and failure, full re-refine —
each new stretch of messages reaches L1 exactly once. The library functions are driven directly, the
way ``workers.tasks`` drives them, without Celery."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from conftest import set_row

from pipeline import (
    anomalies,
    database,
    errors,
    journal,
    l1,
    reader,
    refine,
    refs,
    tables,
)
from pipeline.clock import ManualClock
from pipeline.refiners.builtin import BuiltinRefiner
from pipeline.settings import Refine

BUDGET = 6000
LEASE = 300.0


# ---------------------------------------------------------------------------------------------
# helpers


def add(
    db: database.Database, data_dir: Path, session: str, texts: Sequence[str], *, flush: bool = True
) -> str:
    """Append user messages to a session (and flush them); the file_id."""
    result = journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": session,
            "messages": [{"role": "user", "content": t} for t in texts],
        },
    )
    if flush:
        journal.flush(db, data_dir, result.file_id)
    return result.file_id


def statements(lo: int, hi: int) -> list[str]:
    """Messages the builtin refiner makes exactly one item of each."""
    return [f"I prefer option {n}." for n in range(lo, hi + 1)]


def items(db: database.Database, file_id: str | None = None) -> list[tables.L1Item]:
    with db.transaction() as conn:
        return l1.list_items(conn, file_id=file_id, limit=10_000)


def l1_count(db: database.Database) -> int:
    with db.transaction() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).select_from(tables.l1_items)).scalar_one()
        )


set_file = set_row


def seqs(item: tables.L1Item) -> list[int]:
    return [refs.parse(r)[1] for r in json.loads(item.source_refs)]


def refine_once(
    db: database.Database,
    data_dir: Path,
    c: refine.Claim | None,
    refiner: refine.Refiner | None = None,
    *,
    budget: int = BUDGET,
    overlap: int = 1,
) -> bool:
    """What one ``refine_segment`` task does when nothing fails (``c`` must be a claim)."""
    assert c is not None
    refiner = refiner or BuiltinRefiner()
    found = refine.run(db, data_dir, refiner, c, budget_tokens=budget, overlap=overlap)
    return refine.commit(db, c, found, refiner=refiner.name)


def drive(
    db: database.Database,
    data_dir: Path,
    refiner: refine.Refiner,
    c: refine.Claim,
    max_retries: int,
) -> bool:
    """``workers.tasks.refine_segment`` with its retries unrolled into a loop."""
    for attempt in range(max_retries + 1):
        try:
            found = refine.run(db, data_dir, refiner, c, budget_tokens=BUDGET, overlap=1)
            return refine.commit(db, c, found, refiner=refiner.name)
        except errors.RefinerError as exc:
            if attempt < max_retries:
                continue
            refine.fail(db, c, exc.detail)
    return False


class Flaky:
    """Fails ``failures`` times, then refines like the builtin refiner."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def refine(self, window: refine.Window) -> list[refine.Item]:
        self.calls += 1
        if self.calls <= self.failures:
            raise errors.RefinerError(f"model overloaded (call {self.calls})")
        return BuiltinRefiner().refine(window)


class Fixed:
    """Answers with one item per message: ``"<tag> <seq>"``."""

    def __init__(self, tag: str) -> None:
        self.name = tag

    def refine(self, window: refine.Window) -> list[refine.Item]:
        return [
            refine.Item("fact", f"{self.name} {p.seq}", (window.source_ref(p),))
            for p in window.parts
        ]


def past(db: database.Database, seconds: float) -> dt.datetime:
    """``seconds`` before now on the index's clock."""
    return db.now() - dt.timedelta(seconds=seconds)


# ---------------------------------------------------------------------------------------------
# due files


def test_due_files_honours_min_messages(db: database.Database, data_dir: Path) -> None:
    three = add(db, data_dir, "three", statements(1, 3))
    five = add(db, data_dir, "five", statements(1, 5))

    def due(n: int) -> list[str]:
        return refine.due_files(db, min_messages=n, idle_seconds=3600)

    assert due(3) == [three, five]  # oldest flush first
    assert due(4) == [five]
    assert due(5) == [five]
    assert due(6) == []
    # Only the messages past last_refined_seq count.
    set_file(db, five, last_refined_seq=2)
    assert due(4) == []
    assert due(3) == [three, five]


def test_due_files_honours_idle_seconds(db: database.Database, data_dir: Path) -> None:
    quiet = add(db, data_dir, "quiet", statements(1, 2))
    busy = add(db, data_dir, "busy", statements(1, 2))
    set_file(db, quiet, flushed_at=past(db, 120))
    set_file(db, busy, flushed_at=past(db, 10))

    def due(idle: float) -> list[str]:
        return refine.due_files(db, min_messages=100, idle_seconds=idle)

    assert due(3600) == []
    assert due(60) == [quiet]
    assert due(5) == [quiet, busy]
    assert due(0) == [quiet, busy]


def test_due_files_skips_leased_pending_error_and_done_files(
    db: database.Database, data_dir: Path
) -> None:
    ready = add(db, data_dir, "ready", statements(1, 2))
    leased = add(db, data_dir, "leased", statements(1, 2))
    pending = add(db, data_dir, "pending", statements(1, 2), flush=False)
    failed = add(db, data_dir, "failed", statements(1, 2))
    done = add(db, data_dir, "done", statements(1, 2))
    assert helpers.file_row(db, pending).status == "pending"

    def due() -> set[str]:
        return set(refine.due_files(db, min_messages=1, idle_seconds=0))

    assert due() == {ready, leased, failed, done}
    assert refine.claim(db, leased, lease_seconds=LEASE) is not None
    set_file(db, failed, status="error")
    assert refine_once(db, data_dir, refine.claim(db, done, lease_seconds=LEASE))
    assert due() == {ready}
    # A flushed file forced back to pending is not due either: only new/refined files are.
    set_file(db, ready, status="pending")
    assert due() == set()
    # Once the lease has run out the leased file is due again.
    set_file(db, leased, refine_lease_until=past(db, 1))
    assert due() == {leased}
    assert refine.due_files(db, min_messages=1, idle_seconds=0, file_ids=[ready]) == []
    assert refine.due_files(db, min_messages=1, idle_seconds=0, file_ids=[leased]) == [leased]


def test_due_files_limit_takes_the_oldest_flushes(db: database.Database, data_dir: Path) -> None:
    ids = [add(db, data_dir, f"s{i}", statements(1, 1)) for i in range(4)]
    for i, file_id in enumerate(ids):
        set_file(db, file_id, flushed_at=past(db, 100 - i))
    assert refine.due_files(db, min_messages=1, idle_seconds=0, limit=2) == ids[:2]


def test_due_files_of_given_files_come_oldest_flush_first(
    db: database.Database, data_dir: Path
) -> None:
    """A flush round asks about the files it wrote (each looked up by its key): the due ones
    among them, the longest flushed first — a reindexed file, with no ``flushed_at``, first —
    each once, at most ``limit``."""
    ids = [add(db, data_dir, f"s{i}", statements(1, 1)) for i in range(4)]
    for i, file_id in enumerate(ids):
        set_file(db, file_id, flushed_at=past(db, 100 - i))
    set_file(db, ids[3], flushed_at=None)
    set_file(db, ids[2], status="error")

    def due(file_ids: list[str], limit: int = 100) -> list[str]:
        return refine.due_files(db, min_messages=1, idle_seconds=0, limit=limit, file_ids=file_ids)

    asked = [ids[1], ids[3], ids[0], ids[2], ids[1]]
    assert due(asked) == [ids[3], ids[0], ids[1]]
    assert due(asked, limit=2) == [ids[3], ids[0]]
    assert due([ids[2]]) == []


# ---------------------------------------------------------------------------------------------
# claim


def test_claim_bumps_the_epoch_and_leases_the_segment(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 3))
    c = refine.claim(db, file_id, lease_seconds=LEASE)

    assert c == refine.Claim(file_id, 0, 3, 1)
    r = helpers.file_row(db, file_id)
    assert r.refine_epoch == 1
    assert r.refine_lease_until == db.now() + dt.timedelta(seconds=LEASE)
    assert (r.last_refined_seq, r.status) == (0, "new")

    # Leased: nobody else gets it, and the epoch stays.
    assert refine.claim(db, file_id, lease_seconds=LEASE) is None
    assert helpers.file_row(db, file_id).refine_epoch == 1


def test_an_expired_lease_can_be_claimed_again_with_a_higher_epoch(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 3))
    first = refine.claim(db, file_id, lease_seconds=LEASE)
    assert first == refine.Claim(file_id, 0, 3, 1)
    set_file(db, file_id, refine_lease_until=past(db, 1))

    second = refine.claim(db, file_id, lease_seconds=LEASE)
    assert second == refine.Claim(file_id, 0, 3, 2)

    # A lease that is already over when taken (a worker that died at once) frees the file too.
    set_file(db, file_id, refine_lease_until=None)
    third = refine.claim(db, file_id, lease_seconds=-1)
    assert third == refine.Claim(file_id, 0, 3, 3)
    assert refine.claim(db, file_id, lease_seconds=LEASE) == refine.Claim(file_id, 0, 3, 4)


def test_claim_of_a_file_with_nothing_to_refine_is_none(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 2))
    pending = add(db, data_dir, "p", statements(1, 2), flush=False)
    assert refine_once(db, data_dir, refine.claim(db, file_id, lease_seconds=LEASE))
    assert refine.claim(db, file_id, lease_seconds=LEASE) is None
    assert refine.claim(db, pending, lease_seconds=LEASE) is None
    assert refine.claim(db, "9e0a2b4c-6d8f-4a1b-9c3d-5e7f9a1b3c5d", lease_seconds=1) is None
    assert helpers.file_row(db, file_id).refine_epoch == 1
    assert helpers.file_row(db, pending).refine_epoch == 0


def test_dispatch_claims_every_due_file_once(db: database.Database, data_dir: Path) -> None:
    a = add(db, data_dir, "a", statements(1, 2))
    b = add(db, data_dir, "b", statements(1, 3))
    kwargs: dict[str, Any] = {"min_messages": 1, "idle_seconds": 0, "lease_seconds": LEASE}
    claims = refine.dispatch(db, **kwargs)
    assert sorted(claims, key=lambda c: c.hi) == [
        refine.Claim(a, 0, 2, 1),
        refine.Claim(b, 0, 3, 1),
    ]
    assert refine.dispatch(db, **kwargs) == []


# ---------------------------------------------------------------------------------------------
# commit


def test_commit_stores_items_and_advances_last_refined_seq(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", [*statements(1, 2), "What time is it?", "I'm a pilot."])
    c = refine.claim(db, file_id, lease_seconds=LEASE)
    assert c == refine.Claim(file_id, 0, 4, 1)

    assert refine_once(db, data_dir, c) is True

    r = helpers.file_row(db, file_id)
    assert (r.last_refined_seq, r.status, r.refine_lease_until, r.refine_epoch) == (
        4,
        "refined",
        None,
        1,
    )
    assert r.refined_at is not None
    stored = items(db, file_id)
    assert [(i.kind, i.content, json.loads(i.source_refs)) for i in stored] == [
        ("preference", "I prefer option 1.", [f"{file_id}:1"]),
        ("preference", "I prefer option 2.", [f"{file_id}:2"]),
        ("profile", "I'm a pilot.", [f"{file_id}:4"]),
    ]
    assert {(i.agent_id, i.refiner, i.segment_lo, i.segment_hi) for i in stored} == {
        ("hermes", "builtin", 0, 4)
    }
    assert refine.due_files(db, min_messages=1, idle_seconds=0) == []


def test_a_duplicate_job_commits_nothing(db: database.Database, data_dir: Path) -> None:
    file_id = add(db, data_dir, "s", statements(1, 3))
    c = refine.claim(db, file_id, lease_seconds=LEASE)
    assert c is not None
    found = refine.run(db, data_dir, BuiltinRefiner(), c, budget_tokens=BUDGET, overlap=1)
    assert len(found) == 3

    assert refine.commit(db, c, found, refiner="builtin") is True
    assert l1_count(db) == 3
    # The same job again (a redelivered task message): nothing, not even the items.
    assert refine.commit(db, c, found, refiner="builtin") is False
    assert refine_once(db, data_dir, c) is False
    # Even items it never stored before are not stored for a stale claim.
    extra = [refine.Item("fact", "extra", (f"{file_id}:1",))]
    assert refine.commit(db, c, extra, refiner="builtin") is False
    assert l1_count(db) == 3
    r = helpers.file_row(db, file_id)
    assert (r.last_refined_seq, r.status, r.refine_epoch) == (3, "refined", 1)


def test_an_old_epoch_commits_nothing_after_a_reclaim(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 3))
    old = refine.claim(db, file_id, lease_seconds=LEASE)
    set_file(db, file_id, refine_lease_until=past(db, 1))  # the first worker stalled
    new = refine.claim(db, file_id, lease_seconds=LEASE)
    assert old is not None and new is not None
    assert (old.lo, old.hi, old.epoch) == (new.lo, new.hi, new.epoch - 1)

    assert refine_once(db, data_dir, old, Fixed("old")) is False
    assert l1_count(db) == 0
    assert helpers.file_row(db, file_id).last_refined_seq == 0

    assert refine_once(db, data_dir, new, Fixed("new")) is True
    assert refine_once(db, data_dir, old, Fixed("old")) is False
    assert [i.content for i in items(db)] == ["new 1", "new 2", "new 3"]
    assert l1_count(db) == 3


def test_items_repeated_by_overlapping_windows_are_stored_once(
    db: database.Database, data_dir: Path
) -> None:
    texts = [f"I prefer option {n}. " + "Some more words here. " * 6 for n in range(1, 21)]
    file_id = add(db, data_dir, "s", texts)
    c = refine.claim(db, file_id, lease_seconds=LEASE)
    assert c is not None
    r, msgs = refine.segment(db, data_dir, c)
    windows = refine.windows(r, msgs, budget_tokens=150, overlap=2)
    assert len(windows) >= 5  # so several statements come twice, once as overlap
    found = refine.run(db, data_dir, BuiltinRefiner(), c, budget_tokens=150, overlap=2)
    assert len(found) > 20

    assert refine.commit(db, c, found, refiner="builtin")

    stored = items(db, file_id)
    assert sorted(i.content for i in stored) == sorted(statements(1, 20))
    assert l1_count(db) == 20


# ---------------------------------------------------------------------------------------------
# appends during a refine: nothing refined twice, nothing skipped


def assert_each_message_once(db: database.Database, file_id: str, last: int) -> None:
    """The stored segments tile 1..last, and every message is in exactly one item whose
    segment holds it."""
    stored = items(db, file_id)
    segments = sorted({(i.segment_lo, i.segment_hi) for i in stored})
    assert segments[0][0] == 0 and segments[-1][1] == last
    assert all(a[1] == b[0] for a, b in itertools.pairwise(segments))
    for item in stored:
        assert all(item.segment_lo < seq <= item.segment_hi for seq in seqs(item))
    covered = Counter(seq for item in stored for seq in seqs(item))
    assert covered == Counter(range(1, last + 1))


def test_an_append_during_a_refine_is_refined_next_exactly_once(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 3))
    c = refine.claim(db, file_id, lease_seconds=LEASE)
    assert c == refine.Claim(file_id, 0, 3, 1)
    found = refine.run(db, data_dir, BuiltinRefiner(), c, budget_tokens=BUDGET, overlap=1)

    # While the refiner works on (0, 3], two more messages arrive and are flushed.
    assert add(db, data_dir, "s", statements(4, 5)) == file_id
    assert helpers.file_row(db, file_id).flushed_seq == 5
    assert refine.claim(db, file_id, lease_seconds=LEASE) is None  # still leased

    assert refine.commit(db, c, found, refiner="builtin") is True
    r = helpers.file_row(db, file_id)
    assert (r.last_refined_seq, r.status, r.refine_lease_until) == (3, "new", None)
    assert refine.due_files(db, min_messages=1, idle_seconds=0) == [file_id]

    nxt = refine.claim(db, file_id, lease_seconds=LEASE)
    assert nxt == refine.Claim(file_id, 3, 5, 2)
    assert refine_once(db, data_dir, nxt) is True
    r = helpers.file_row(db, file_id)
    assert (r.last_refined_seq, r.status) == (5, "refined")

    stored = items(db, file_id)
    assert [(i.content, i.segment_lo, i.segment_hi) for i in stored] == [
        ("I prefer option 1.", 0, 3),
        ("I prefer option 2.", 0, 3),
        ("I prefer option 3.", 0, 3),
        ("I prefer option 4.", 3, 5),
        ("I prefer option 5.", 3, 5),
    ]
    assert_each_message_once(db, file_id, 5)


def test_interleaved_appends_and_refines_cover_every_message_once(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 2))
    n = 2
    pending: list[refine.Claim] = []
    for round_ in range(6):
        c = refine.claim(db, file_id, lease_seconds=LEASE)
        if c is not None:
            pending.append(c)
        # Appends keep coming; some jobs finish late, after the next append.
        add(db, data_dir, "s", statements(n + 1, n + 1 + round_ % 3))
        n += 1 + round_ % 3
        if pending and round_ % 2:
            for job in pending:
                refine_once(db, data_dir, job)
            pending.clear()
    for job in pending:
        refine_once(db, data_dir, job)
    while (c := refine.claim(db, file_id, lease_seconds=LEASE)) is not None:
        assert refine_once(db, data_dir, c)

    r = helpers.file_row(db, file_id)
    assert (r.flushed_seq, r.last_refined_seq, r.status) == (n, n, "refined")
    assert l1_count(db) == n
    assert_each_message_once(db, file_id, n)


# ---------------------------------------------------------------------------------------------
# failures and retries


def test_a_refiner_that_fails_then_succeeds_ends_refined(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 3))
    c = refine.claim(db, file_id, lease_seconds=LEASE)
    assert c is not None
    flaky = Flaky(failures=3)

    assert drive(db, data_dir, flaky, c, max_retries=3) is True

    assert flaky.calls == 4
    r = helpers.file_row(db, file_id)
    assert (r.last_refined_seq, r.status) == (3, "refined")
    assert [(i.content, i.refiner) for i in items(db, file_id)] == [
        (t, "flaky") for t in statements(1, 3)
    ]
    with db.transaction() as conn:
        assert anomalies.listed(conn, file_id=file_id) == []


def test_a_refiner_that_always_fails_marks_the_file_error_and_others_go_on(
    db: database.Database, data_dir: Path
) -> None:
    broken = add(db, data_dir, "broken", statements(1, 3))
    fine = add(db, data_dir, "fine", statements(1, 2))
    c = refine.claim(db, broken, lease_seconds=LEASE)
    assert c is not None
    always = Flaky(failures=10**9)

    # The failing file's retries do not hold the other file up.
    other = refine.claim(db, fine, lease_seconds=LEASE)
    assert other == refine.Claim(fine, 0, 2, 1)
    assert drive(db, data_dir, always, c, max_retries=2) is False
    assert always.calls == 3
    assert refine_once(db, data_dir, other) is True

    r = helpers.file_row(db, broken)
    assert (r.status, r.last_refined_seq, r.refine_lease_until) == ("error", 0, None)
    with db.transaction() as conn:
        [anomaly] = anomalies.listed(conn, file_id=broken)
    assert anomaly.kind == "refine_failed"
    assert anomaly.detail == "segment 0<seq<=3: model overloaded (call 3)"
    assert items(db, broken) == []
    assert helpers.file_row(db, fine).status == "refined"
    assert [i.content for i in items(db, fine)] == statements(1, 2)

    # An error file is neither due nor claimable, though its messages are unrefined…
    assert refine.due_files(db, min_messages=1, idle_seconds=0) == []
    assert refine.claim(db, broken, lease_seconds=LEASE) is None
    # …and a new file is still refined.
    third = add(db, data_dir, "third", statements(1, 1))
    assert refine.due_files(db, min_messages=1, idle_seconds=0) == [third]
    # A full re-refine (the operator's fix) brings the broken file back.
    refine.request_full(db, broken)
    assert helpers.file_row(db, broken).status == "new"
    again = refine.claim(db, broken, lease_seconds=LEASE)
    assert again == refine.Claim(broken, 0, 3, 3)
    assert refine_once(db, data_dir, again)
    assert [i.content for i in items(db, broken)] == statements(1, 3)


def test_fail_of_a_stale_claim_does_nothing(db: database.Database, data_dir: Path) -> None:
    file_id = add(db, data_dir, "s", statements(1, 2))
    old = refine.claim(db, file_id, lease_seconds=LEASE)
    set_file(db, file_id, refine_lease_until=past(db, 1))
    new = refine.claim(db, file_id, lease_seconds=LEASE)
    assert old is not None and new is not None

    assert refine.fail(db, old, "late failure") is False
    r = helpers.file_row(db, file_id)
    assert r.status == "new" and r.refine_lease_until is not None
    with db.transaction() as conn:
        assert anomalies.listed(conn, file_id=file_id) == []
    assert refine_once(db, data_dir, new) is True


# ---------------------------------------------------------------------------------------------
# full re-refine


def test_request_full_refines_everything_again_and_replaces_the_items(
    db: database.Database, data_dir: Path
) -> None:
    file_id = add(db, data_dir, "s", statements(1, 3))
    first = refine.claim(db, file_id, lease_seconds=LEASE)
    assert first is not None
    assert refine_once(db, data_dir, first, Fixed("v1"))
    add(db, data_dir, "s", statements(4, 5))
    in_flight = refine.claim(db, file_id, lease_seconds=LEASE)
    assert in_flight == refine.Claim(file_id, 3, 5, 2)

    refine.request_full(db, file_id)

    r = helpers.file_row(db, file_id)
    assert (r.last_refined_seq, r.refine_epoch, r.refine_lease_until, r.status) == (
        0,
        3,
        None,
        "new",
    )
    # The job that was running for (3, 5] finishes after the request: it commits nothing.
    assert refine_once(db, data_dir, in_flight, Fixed("v1")) is False
    assert helpers.file_row(db, file_id).last_refined_seq == 0

    full = refine.claim(db, file_id, lease_seconds=LEASE)
    assert full == refine.Claim(file_id, 0, 5, 4)
    assert refine_once(db, data_dir, full, Fixed("v2"))

    stored = items(db, file_id)
    assert [(i.content, i.refiner, i.segment_lo, i.segment_hi) for i in stored] == [
        (f"v2 {n}", "v2", 0, 5) for n in range(1, 6)
    ]
    assert l1_count(db) == 5
    assert_each_message_once(db, file_id, 5)
    assert (
        helpers.file_row(db, file_id).last_refined_seq,
        helpers.file_row(db, file_id).status,
    ) == (5, "refined")


def test_request_full_leaves_other_files_items_alone(db: database.Database, data_dir: Path) -> None:
    a = add(db, data_dir, "a", statements(1, 2))
    b = add(db, data_dir, "b", statements(1, 2))
    for file_id in (a, b):
        assert refine_once(db, data_dir, refine.claim(db, file_id, lease_seconds=LEASE))
    refine.request_full(db, a)
    assert [i.content for i in items(db, b)] == statements(1, 2)
    assert helpers.file_row(db, b).status == "refined"


def test_request_full_refuses_unknown_and_unflushed_files(
    db: database.Database, data_dir: Path
) -> None:
    pending = add(db, data_dir, "p", statements(1, 1), flush=False)
    with pytest.raises(errors.NotFound):
        refine.request_full(db, "9e0a2b4c-6d8f-4a1b-9c3d-5e7f9a1b3c5d")
    with pytest.raises(errors.InvalidInput):
        refine.request_full(db, "not-a-file-id")
    with pytest.raises(errors.Conflict):
        refine.request_full(db, pending)


# ---------------------------------------------------------------------------------------------
# items point back at their messages


def test_every_item_resolves_to_the_message_it_came_from(
    db: database.Database, data_dir: Path
) -> None:
    result = journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "mixed",
            "messages": [
                {"role": "user", "content": "Hi! My name is Dana and I live in Oslo."},
                {"role": "assistant", "content": "Nice to meet you. We decided to use Rust."},
                {"role": "tool", "tool_name": "read_file", "content": "fn main() {}\n// end"},
                {"role": "user", "content": "我喜欢喝咖啡。我在北京工作。"},
                {"role": "user", "content": "```\nI prefer code.\n```\nI prefer tea."},
                {"role": "assistant", "content": "Okay."},
            ],
        },
    )
    file_id = result.file_id
    journal.flush(db, data_dir, file_id)
    assert add(db, data_dir, "mixed", ["I'd rather meet on Monday."]) == file_id
    c = refine.claim(db, file_id, lease_seconds=LEASE)
    assert c == refine.Claim(file_id, 0, 7, 1)
    assert refine_once(db, data_dir, c, budget=64, overlap=1)

    stored = items(db, file_id)
    assert [(i.kind, i.content, seqs(i)) for i in stored] == [
        ("profile", "My name is Dana and I live in Oslo.", [1]),
        ("decision", "We decided to use Rust.", [2]),
        ("tool_result", "read_file: fn main() {}", [3]),
        ("preference", "我喜欢喝咖啡。", [4]),
        ("profile", "我在北京工作。", [4]),
        ("preference", "I prefer tea.", [5]),
        ("preference", "I'd rather meet on Monday.", [7]),
    ]
    for item in stored:
        for source_ref in json.loads(item.source_refs):
            message = reader.resolve(db, data_dir, source_ref).message
            if item.kind == "tool_result":
                name, _, first_line = item.content.partition(": ")
                assert name == message.tool_name
                assert message.content.split("\n")[0] == first_line
            else:
                assert item.content in message.content


# ---------------------------------------------------------------------------------------------
# the lease heartbeat (docs/design.md §4): short leases, renewed by the running job


def test_a_slow_job_keeps_its_claim_and_a_lost_one_frees_the_file(
    db: database.Database, clock: ManualClock, data_dir: Path, database_url: str
) -> None:
    from pipeline.settings import Settings

    lease = 1.0
    file_id = add(db, data_dir, "slow", statements(1, 3))
    config = Settings(
        data_dir=data_dir,
        database_url=database_url,
        refine=Refine(lease_seconds=lease, min_messages=1),
    )
    service = helpers.service(db, config)
    taken: list[refine.Claim | None] = []

    def renewed(until: dt.datetime) -> bool:
        found = helpers.file_row(db, file_id).refine_lease_until
        return found is not None and found >= until

    class Slow:
        """A model call that takes three leases of the test's clock; meanwhile others try to
        claim the file."""

        name = "slow"

        def refine(self, window: refine.Window) -> list[refine.Item]:
            for _ in range(8):
                now = clock.advance(0.4 * lease)  # past a renewal, within the lease
                until = now + dt.timedelta(seconds=lease)
                helpers.wait_for(
                    functools.partial(renewed, until),
                    timeout=10,
                    what="the heartbeat to renew the lease",
                )
                taken.append(refine.claim(db, file_id, lease_seconds=lease))
            return BuiltinRefiner().refine(window)

    service.refiners = refine.Refiners.given(Slow())
    c = refine.claim(db, file_id, lease_seconds=lease)
    assert c is not None
    assert service.refine_segment(c, final=True) is True
    assert taken == [None] * 8  # renewed: never claimable meanwhile
    done = helpers.file_row(db, file_id)
    assert (done.last_refined_seq, done.refine_lease_until, done.status) == (3, None, "refined")
    assert sorted(seqs(i)[0] for i in items(db, file_id)) == [1, 2, 3]

    # A job lost with its worker renews nothing: the file is claimable again once its lease
    # has run out, and not before.
    add(db, data_dir, "slow", statements(4, 4))
    lost = refine.claim(db, file_id, lease_seconds=lease)
    assert lost is not None
    clock.advance(lease * 0.9)
    assert refine.claim(db, file_id, lease_seconds=lease) is None
    clock.advance(lease * 0.2)
    again = refine.claim(db, file_id, lease_seconds=lease)
    assert again is not None
    assert again.epoch == lost.epoch + 1 and (again.lo, again.hi) == (3, 4)
