"""The embedded service's flush threads (:class:`pipeline.local_queue.LocalQueue`), over a
flusher played by a fake: kicks coalesce into rounds, a file kicked while its round runs is
flushed again, what a round leaves is queued again or flushed on its own, and refinement jobs
go to the task queue."""

from __future__ import annotations

import threading
from collections.abc import Callable

import helpers

from pipeline import errors, flusher, local_queue, refine
from pipeline.flush import FlushResult, Round


def result(file_id: str, *, more: bool = False) -> FlushResult:
    return FlushResult(file_id, 1, 10, 1, "new", more=more)


class Fake(flusher.Flusher):
    """Rounds and flushes of one file that record their calls; the first round holds until
    :attr:`release` is set; :attr:`plan` answers a round (all written, by default)."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []
        self.alone: list[str] = []
        self.started, self.release = threading.Event(), threading.Event()
        self.plan: Callable[[list[str]], Round] = self.written

    @staticmethod
    def written(file_ids: list[str]) -> Round:
        return Round(results={f: result(f) for f in file_ids})

    def round(self, file_ids: list[str], *, wait: bool = False) -> Round:
        self.rounds.append(file_ids)
        if len(self.rounds) == 1:
            self.started.set()
            assert self.release.wait(5)
        return self.plan(file_ids)

    def flush(self, file_id: str) -> FlushResult:
        self.alone.append(file_id)
        if file_id == "bad":
            raise RuntimeError("a bug")
        return result(file_id)


def test_kicks_coalesce_and_a_kick_during_a_round_flushes_again() -> None:
    jobs = helpers.RecordingQueue()
    threads = local_queue.LocalQueue(jobs, threads=2, linger=0)
    fake = Fake()
    followed: list[list[FlushResult]] = []
    threads.start(fake, followed.append)
    try:
        threads.kick("slow")
        assert fake.started.wait(5)
        for _ in range(3):  # kicked while its round runs: one more round, not three
            threads.kick("slow")
        threads.kick("other")
        fake.release.set()
        helpers.wait_for(threads.idle, what="the threads to go idle", timeout=5)
        assert fake.rounds == [["slow"], ["slow", "other"]]
        assert followed == [[result("slow")], [result("slow"), result("other")]]
        claim = refine.Claim("f", 0, 1, 1)
        threads.submit(claim)
        assert jobs.claims == [claim]
    finally:
        threads.close()
    threads.kick("after")  # closed: taken no more (the sweep of the next start finds it)
    assert ["after"] not in fake.rounds


def test_what_a_round_leaves_is_queued_again_or_flushed_on_its_own() -> None:
    threads = local_queue.LocalQueue(helpers.RecordingQueue(), threads=1, linger=0)
    fake = Fake()

    def plan(ids: list[str]) -> Round:
        if ids == ["a", "busy", "late"]:
            return Round(results={"a": result("a")}, again=["busy"], later=["late"])
        return Fake.written(ids)

    fake.plan = plan
    threads.start(fake)
    try:
        threads.kick("gate")  # the first round holds: the next three kicks share one
        assert fake.started.wait(5)
        for file_id in ("a", "busy", "late"):
            threads.kick(file_id)
        fake.release.set()
        helpers.wait_for(threads.idle, what="the rounds", timeout=5)
        assert fake.rounds == [["gate"], ["a", "busy", "late"], ["late"]]  # past the budget
        assert fake.alone == ["busy"]  # busy: flushed on its own, waiting for its lock
        assert (threads.rounds, threads.round_files) == (3, 3)
    finally:
        threads.close()


def test_a_failing_round_or_flush_does_not_stop_the_threads() -> None:
    threads = local_queue.LocalQueue(helpers.RecordingQueue(), threads=1, linger=0)
    fake = Fake()
    fake.release.set()

    def plan(ids: list[str]) -> Round:
        if "bad" in ids:
            raise errors.IndexUnavailable("index unreachable")
        return Round(results={f: result(f) for f in ids})

    fake.plan = plan
    threads.start(fake)
    try:
        threads.kick("bad")  # its round fails: flushed alone, where it fails again
        helpers.wait_for(lambda: fake.alone == ["bad"], what="the flush alone", timeout=5)
        threads.kick("good")
        helpers.wait_for(lambda: ["good"] in fake.rounds, what="the next round", timeout=5)
        helpers.wait_for(threads.idle, what="the threads to go idle", timeout=5)
    finally:
        threads.close()
