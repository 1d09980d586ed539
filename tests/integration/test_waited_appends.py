"""Appends that wait for their file (``wait=flushed``) share flush rounds (pipeline.waits), on
SQLite and PostgreSQL: every wait is answered once its messages are in the file, and a damaged
file fails only its own waits. The worker's flush tasks on a thread pool share rounds the
same way."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helpers

from pipeline import database, integrity, reader
from pipeline.flush import FlushResult
from pipeline.service import Appended, Service
from pipeline.settings import Settings


def _body(key: str, text: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    return {"agent_id": "hermes", "session_key": key, "messages": messages}


class Calling(threading.Thread):
    """A call on a thread of its own, keeping its answer or its error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.answer: Any = None

    def run(self) -> None:
        try:
            self.answer = self.call()
        except BaseException as exc:
            self.answer = exc


def waited_append(service: Service, body: dict[str, Any]) -> Calling:
    """An append that waits for its file."""
    return Calling(lambda: helpers.append(service, body, wait=True))


def flush_task(service: Service, file_id: str) -> Calling:
    """A flush task's call (``Service.wait_flushed``)."""
    return Calling(lambda: service.wait_flushed(file_id))


def _behind_a_held_lock(
    service: Service, held: str, first: Calling, rest: list[Calling]
) -> tuple[Calling, list[Calling]]:
    """``first`` (which flushes ``held``) waits for the file's lock, which the test holds
    until ``rest`` queued behind it; both, once answered."""
    with service.file_locks.hold(held):
        first.start()
        helpers.wait_for(service.waits.leading, what="the held file's flush")
        for calling in rest:
            calling.start()
        helpers.wait_for(lambda: service.waits.queued() == len(rest), what="waits queued")
    for calling in [first, *rest]:
        calling.join(30)
        assert not calling.is_alive()
    return first, rest


def _behind_a_held_file(
    service: Service, held: str, bodies: list[dict[str, Any]]
) -> tuple[Calling, list[Calling]]:
    """A wait for ``held`` whose flush waits for the file's lock, which the test holds until
    the waits of ``bodies`` queued behind it; both, once answered."""
    file_id = helpers.append(service, _body(held, "more")).result.file_id
    first = waited_append(service, _body(held, "waited"))
    return _behind_a_held_lock(service, file_id, first, [waited_append(service, b) for b in bodies])


def _service(db: database.Database, data_dir: Path, database_url: str) -> Service:
    return helpers.service(db, Settings(data_dir=data_dir, database_url=database_url))


def test_concurrent_waits_share_a_round_and_each_is_in_its_file(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = _service(db, data_dir, database_url)
    keys = [f"s{i}" for i in range(6)]
    for key in keys:
        helpers.append(service, _body(key, f"{key} first"), wait=True)
    rounds = service.waits.rounds
    first, rest = _behind_a_held_file(
        service, "held", [_body(key, f"{key} second") for key in keys]
    )
    assert service.waits.rounds == rounds + 2  # the held file's flush, then one round of six
    for waiting in [first, *rest]:
        assert isinstance(waiting.answer, Appended)
        assert waiting.answer.flushed and waiting.answer.status == "new"
    for key, waiting in zip(keys, rest, strict=True):
        assert isinstance(waiting.answer, Appended)
        file_id = waiting.answer.result.file_id
        texts = [m.content for m in reader.messages(db, data_dir, file_id)]
        assert texts == [f"{key} first", f"{key} second"]
        assert helpers.file_row(db, file_id).flushed_seq == 2
    assert integrity.fsck(db, data_dir) == []


def test_a_damaged_file_fails_only_its_own_wait(
    db: database.Database, data_dir: Path, database_url: str, tmp_path: Path
) -> None:
    service = _service(db, data_dir, database_url)
    ids = [helpers.append(service, _body(k, "first"), wait=True).result.file_id for k in "ab"]
    path = data_dir / helpers.file_row(db, ids[0]).path
    elsewhere = tmp_path / "elsewhere.md"
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere)  # file "a" is no longer a file of ours: refused, recorded
    rounds = service.waits.rounds
    _, (damaged, plain) = _behind_a_held_file(
        service, "held", [_body("a", "second"), _body("b", "second")]
    )
    assert service.waits.rounds == rounds + 2  # the held file's flush, then a and b together
    assert isinstance(damaged.answer, Appended) and isinstance(plain.answer, Appended)
    # acknowledged (in the journal) but not in the file: the client must not send it again
    assert (damaged.answer.flushed, damaged.answer.result.last_seq) == (False, 2)
    assert helpers.file_row(db, ids[0]).status == "error"
    assert plain.answer.flushed
    assert [m.content for m in reader.messages(db, data_dir, ids[1])] == ["first", "second"]


def test_a_replayed_append_is_answered_from_the_file_as_it_is(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    """A replayed append (its idempotency key seen) waits for nothing more: its seq is in the
    file already, and the flush that finds nothing to write is its answer."""
    service = _service(db, data_dir, database_url)
    body = {**_body("k", "once"), "idempotency_key": "key-1"}
    answers = [helpers.append(service, body, wait=True) for _ in range(2)]
    assert [(a.flushed, a.result.replayed, a.result.last_seq) for a in answers] == [
        (True, False, 1),
        (True, True, 1),
    ]
    assert [m.content for m in reader.messages(db, data_dir, answers[0].result.file_id)] == ["once"]


def test_flush_tasks_on_threads_share_a_round(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    """The worker's flush tasks running on a thread pool at the same moment flush their files
    in one round (as waited appends do); each file is written once, in full."""
    service = _service(db, data_dir, database_url)
    ids = [helpers.append(service, _body(f"s{i}", "first")).result.file_id for i in range(5)]
    held = helpers.append(service, _body("held", "first")).result.file_id
    rounds, groups = service.waits.rounds, db.group.groups
    first, rest = _behind_a_held_lock(
        service, held, flush_task(service, held), [flush_task(service, f) for f in ids]
    )
    for task in [first, *rest]:
        assert isinstance(task.answer, FlushResult)
        assert (task.answer.messages, task.answer.flushed_seq) == (1, 1)
    assert service.waits.rounds == rounds + 2  # the held file's flush, then one round of five
    assert db.group.groups == groups + 2  # and one commit each
    for file_id in [held, *ids]:
        assert [m.content for m in reader.messages(db, data_dir, file_id)] == ["first"]
    assert integrity.fsck(db, data_dir) == []
