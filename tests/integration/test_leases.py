"""The lease keeper (:mod:`pipeline.leases`): one thread renews every running refinement job's
lease, stops renewing a claim that was replaced, and ends when no job runs. Real threads; the
leases on the test's clock, moved instead of slept through (docs/design.md §9)."""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time
from pathlib import Path

import helpers
import pytest
from conftest import set_row

from pipeline import database, journal, leases, refine
from pipeline.clock import ManualClock

LEASE = 1.0  #: seconds; renewed every third of it
STEP = 0.4 * LEASE  #: how far the clock moves at a time: past one renewal, well within a lease


def _file(db: database.Database, data_dir: Path, session: str) -> str:
    body = {
        "agent_id": "hermes",
        "session_key": session,
        "messages": [{"role": "user", "content": "I prefer option 1."}],
    }
    result = journal.ingest(db, body)
    journal.flush(db, data_dir, result.file_id)
    return result.file_id


def _claim(db: database.Database, file_id: str) -> refine.Claim:
    found = refine.claim(db, file_id, lease_seconds=LEASE)
    assert found is not None
    return found


def _renewing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sgme-leases"]


def _renewed(db: database.Database, file_id: str, until: dt.datetime) -> bool:
    found = helpers.file_row(db, file_id).refine_lease_until
    return found is not None and found >= until


def _step(db: database.Database, clock: ManualClock, file_ids: list[str]) -> None:
    """Move the clock past the next renewal of every lease of ``file_ids`` and wait for the
    keeper to renew each one: a whole lease from the new now."""
    now = clock.advance(STEP)
    renewed = now + dt.timedelta(seconds=LEASE)
    for file_id in file_ids:
        helpers.wait_for(
            functools.partial(_renewed, db, file_id, renewed),
            timeout=10,
            what=f"the keeper to renew the lease of {file_id}",
        )


def test_one_thread_renews_the_lease_of_every_running_job(
    db: database.Database, clock: ManualClock, data_dir: Path
) -> None:
    files = [_file(db, data_dir, f"s{i}") for i in range(3)]
    claims = [_claim(db, file_id) for file_id in files]
    started = threading.Barrier(len(claims) + 1)
    done = threading.Event()

    def job(c: refine.Claim) -> None:
        with refine.heartbeat(db, c, lease_seconds=LEASE):
            started.wait()
            done.wait(30)

    jobs = [threading.Thread(target=job, args=(c,)) for c in claims]
    for thread in jobs:
        thread.start()
    try:
        started.wait()
        for _ in range(7):  # each lease would have run out twice
            _step(db, clock, files)
            assert [refine.claim(db, f, lease_seconds=LEASE) for f in files] == [None] * 3
        assert len(_renewing_threads()) == 1
        assert leases.KEEPER.renewing() == 3
    finally:
        done.set()
        for thread in jobs:
            thread.join()
    assert leases.KEEPER.renewing() == 0
    # nothing renews them any more: each file is claimable again once its lease ran out
    clock.advance(LEASE * 0.9)
    assert refine.claim(db, files[0], lease_seconds=LEASE) is None
    clock.advance(LEASE * 0.2)
    again = refine.claim(db, files[0], lease_seconds=LEASE)
    assert again is not None and again.epoch == claims[0].epoch + 1


def test_a_replaced_claim_is_no_longer_renewed(
    db: database.Database, clock: ManualClock, data_dir: Path
) -> None:
    file_id = _file(db, data_dir, "replaced")
    c = _claim(db, file_id)
    with refine.heartbeat(db, c, lease_seconds=LEASE):
        assert leases.KEEPER.renewing() == 1
        set_row(db, file_id, refine_epoch=c.epoch + 1)  # a full re-refine took the file over
        clock.advance(STEP)  # past the next renewal: it finds the claim replaced
        helpers.wait_for(
            lambda: leases.KEEPER.renewing() == 0,
            timeout=10,
            what="the keeper to drop the replaced claim",
        )


def test_the_renewing_thread_ends_when_no_job_runs_and_the_next_job_starts_it(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leases, "IDLE_SECONDS", 0.2)  # the thread's idleness is real time
    first, second = (_file(db, data_dir, name) for name in ("first", "second"))
    with refine.heartbeat(db, _claim(db, first), lease_seconds=LEASE):
        assert leases.KEEPER.running()
    helpers.wait_for(lambda: not _renewing_threads(), timeout=10, what="the thread to end")
    assert not leases.KEEPER.running()
    with refine.heartbeat(db, _claim(db, second), lease_seconds=LEASE):
        assert leases.KEEPER.running()
        assert leases.KEEPER.renewing() == 1


def test_a_shorter_lease_taken_while_the_thread_waits_for_a_longer_one_is_renewed_in_time(
    db: database.Database, clock: ManualClock, data_dir: Path
) -> None:
    long_file, short_file = (_file(db, data_dir, name) for name in ("long", "short"))
    long_claim = refine.claim(db, long_file, lease_seconds=60)
    assert long_claim is not None
    short_claim = _claim(db, short_file)
    with refine.heartbeat(db, long_claim, lease_seconds=60):  # its first renewal in 20 s
        helpers.wait_for(
            lambda: 10 < leases.KEEPER.wakes() - time.monotonic() < 60,
            timeout=10,
            what="the thread to wait for the long lease's renewal",
        )
        with refine.heartbeat(db, short_claim, lease_seconds=LEASE):
            # taking it woke the thread, not the clock (it has not moved yet)
            helpers.wait_for(
                lambda: leases.KEEPER.wakes() - time.monotonic() <= LEASE / 3,
                timeout=10,
                what="the thread to wait for the short lease's renewal instead",
            )
            for _ in range(7):
                _step(db, clock, [short_file])
                assert refine.claim(db, short_file, lease_seconds=LEASE) is None
