"""The embedded service's flush threads (:class:`pipeline.local_queue.LocalQueue`): kicks
coalesce, a file kicked while it is being flushed is flushed again, and refinement jobs go to
the task queue."""

from __future__ import annotations

import threading

import helpers

from pipeline import local_queue, refine


def test_kicks_coalesce_and_a_kick_during_a_flush_flushes_again() -> None:
    jobs = helpers.RecordingQueue()
    threads = local_queue.LocalQueue(jobs, threads=2)
    started, release = threading.Event(), threading.Event()
    flushed: list[str] = []

    def flush(file_id: str) -> None:
        flushed.append(file_id)
        if file_id == "slow" and len(flushed) == 1:
            started.set()
            release.wait(5)

    threads.start(flush)
    try:
        threads.kick("slow")
        assert started.wait(5)
        for _ in range(3):  # kicked while its flush runs: one more flush, not three
            threads.kick("slow")
        threads.kick("other")
        release.set()
        helpers.wait_for(threads.idle, what="the threads to go idle", timeout=5)
        assert sorted(flushed) == ["other", "slow", "slow"]
        claim = refine.Claim("f", 0, 1, 1)
        threads.submit(claim)
        assert jobs.claims == [claim]
    finally:
        threads.close()
    threads.kick("after")  # closed: taken no more (the sweep of the next start finds it)
    assert "after" not in flushed


def test_a_failing_flush_does_not_stop_the_thread() -> None:
    flushed: list[str] = []

    def flush(file_id: str) -> None:
        flushed.append(file_id)
        if file_id == "bad":
            raise RuntimeError("a bug")

    threads = local_queue.LocalQueue(helpers.RecordingQueue(), threads=1)
    threads.start(flush)
    try:
        threads.kick("bad")
        threads.kick("good")
        helpers.wait_for(lambda: "good" in flushed, what="the next flush", timeout=5)
    finally:
        threads.close()
