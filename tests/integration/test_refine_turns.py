"""Refinement jobs take turns in a process (``refine_jobs_at_once``, :meth:`Refiners.turn`):
one at a time for a refiner that is not ``parallel`` (the builtin one), as many as the
setting says, or all at once for a refiner that waits on a model or a service."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import helpers
import pytest

from pipeline import database, journal, refine
from pipeline.refiners.builtin import BuiltinRefiner
from pipeline.settings import Refine, Settings


class Gate:
    """A refiner that counts the jobs inside it and holds each until :meth:`open`."""

    name = "gate"

    def __init__(self, *, parallel: bool) -> None:
        self.parallel = parallel
        self.entered: list[int] = []  #: the threads that came in, in order
        self.inside = 0
        self.most = 0  #: the most jobs inside at once
        self._changed = threading.Condition()
        self._opened = False

    def refine(self, window: refine.Window) -> list[refine.Item]:
        with self._changed:
            self.entered.append(threading.get_ident())
            self.inside += 1
            self.most = max(self.most, self.inside)
            self._changed.wait_for(lambda: self._opened, timeout=30)
            self.inside -= 1
        return BuiltinRefiner().refine(window)

    def open(self) -> None:
        with self._changed:
            self._opened = True
            self._changed.notify_all()


def waiting_for_a_turn(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside :meth:`Refiners.turn`, waiting for its turn."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "turn" and frame.f_code.co_filename.endswith("refine.py"):
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize(
    ("parallel", "jobs_at_once", "at_once"),
    [(False, 0, 1), (True, 2, 2), (True, 0, 3), (False, 3, 3)],
    ids=["not parallel: one", "setting: two", "parallel: all", "setting over the refiner"],
)
def test_refinement_jobs_take_turns(
    db: database.Database,
    data_dir: Path,
    database_url: str,
    parallel: bool,
    jobs_at_once: int,
    at_once: int,
) -> None:
    settings = Settings(data_dir=data_dir, database_url=database_url, refine=Refine(min_messages=1))
    service = helpers.service(db, settings)
    gate = Gate(parallel=parallel)
    service.refiners = refine.Refiners.given(gate, jobs_at_once=jobs_at_once)
    claims = []
    for n in range(3):
        body = {
            "agent_id": "a",
            "session_key": f"s{n}",
            "messages": [{"role": "user", "content": f"I prefer option {n}."}],
        }
        file_id = journal.ingest(db, body).file_id
        journal.flush(db, data_dir, file_id)
        claim = refine.claim(db, file_id, lease_seconds=300)
        assert claim is not None
        claims.append(claim)

    done: dict[str, bool] = {}

    def job(c: refine.Claim) -> None:
        done[c.file_id] = service.refine_segment(c, final=True)

    threads = [threading.Thread(target=job, args=(c,)) for c in claims]
    for thread in threads:
        thread.start()
    try:
        # the jobs that have their turn are in the refiner; the others wait for theirs
        helpers.wait_for(
            lambda: (
                len(gate.entered) == at_once
                and sum(waiting_for_a_turn(t) for t in threads) == 3 - at_once
            ),
            what=f"{at_once} jobs in the refiner and the others waiting for a turn",
        )
        assert len(gate.entered) == at_once
    finally:
        gate.open()
        for thread in threads:
            thread.join(30)
    assert gate.most == at_once
    assert len(gate.entered) == 3
    assert done == {c.file_id: True for c in claims}
    for c in claims:
        assert helpers.file_row(db, c.file_id).last_refined_seq == 1


def test_the_builtin_refiner_takes_turns_and_the_setting_reaches_the_holder(
    data_dir: Path, database_url: str
) -> None:
    assert BuiltinRefiner.parallel is False
    settings = Settings(data_dir=data_dir, database_url=database_url, refine=Refine(jobs_at_once=2))
    assert refine.Refiners.configured(settings).jobs_at_once == 2
    assert refine.Refiners.configured(Settings(data_dir=data_dir)).jobs_at_once == 0
