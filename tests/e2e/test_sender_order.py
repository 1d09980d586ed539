"""End to end, issue 13: an ingestion service's ``sgme.append`` tasks, numbered with
``sequence``, land in the order it sent them — with real ``sgme worker`` processes (prefork,
concurrency 4) consuming one Redis queue, on PostgreSQL, which together reorder tasks freely.

* 300 tasks of one session, sent back to back (a few pairs swapped, some tasks twice): each
  message is in the file once, in sequence order.
* A gap (1–10 and 12–20 sent, 11 never): after ``order_wait_seconds`` the rest lands in order
  and one ``sequence_gap`` names 11; 11 coming late is recorded, not appended.
* The worker SIGKILLed (its whole process group) while 149 tasks wait for their predecessor:
  nothing lost, nothing doubled, the order kept, by a new worker.

Skipped off CI when PostgreSQL or Redis is missing (the ``production`` fixture).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import harness
import pytest
import sqlalchemy as sa
from celery import Celery
from conftest import REDIS_URL

from pipeline import anomalies, database, index, ledger, reader, tables

AGENT = "e2e-order"
#: what the tests look for in the anomalies table (an append task dropped for any reason too)
ORDER_KINDS = ("sequence_gap", "sequence_late", "sequence_duplicate", "append_task_rejected")


class Deployment:
    """``sgme migrate``, then workers and one beat on the test's PostgreSQL and Redis; the
    index read directly for the checks."""

    def __init__(
        self, procs: harness.Procs, tmp_path: Path, database_url: str, **settings: str
    ) -> None:
        self.procs = procs
        self.data_dir = tmp_path / "data"
        self.env = harness.clean_env(**harness.FAST, **settings)
        self.args = ["--data-dir", str(self.data_dir), "--database-url", database_url]
        self.broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
        procs.run(["migrate", *self.args], self.env)
        self.db = database.Database.from_url(database_url)
        self.children: list[harness.Proc] = []
        self.session_key = f"order-{uuid.uuid4().hex[:8]}"

    def worker(self, name: str, *, pool: str = "prefork") -> harness.Proc:
        argv = ["worker", *self.args, *self.broker, "--queues", "append"]
        proc = self.procs.start(name, [*argv, "--pool", pool, "--concurrency", "4"], self.env)
        self.children.append(proc)
        return proc

    def beat(self) -> harness.Proc:
        proc = self.procs.start("beat", ["beat", *self.args, *self.broker], self.env)
        self.children.append(proc)
        return proc

    def alive(self) -> None:
        for proc in self.children:
            proc.check_alive()

    def task(self, sequence: int) -> dict[str, Any]:
        """The body of task ``sequence``: one message naming it (a few carry two)."""
        messages = [{"role": "user", "content": f"#{sequence}"}]
        if sequence % 7 == 0:
            messages.append({"role": "assistant", "content": f"#{sequence}b"})
        return {
            "agent_id": AGENT,
            "session_key": self.session_key,
            "idempotency_key": f"{self.session_key}/{sequence}",
            "sequence": sequence,
            "messages": messages,
        }

    def expected(self, sequences: Iterable[int]) -> list[str]:
        """The file's messages when exactly ``sequences`` were applied, in order."""
        found = []
        for n in sorted(sequences):
            found += [m["content"] for m in self.task(n)["messages"]]
        return found

    def send(self, sequences: Iterable[int]) -> None:
        """Enqueue the tasks, as an ingestion service does, on connections closed afterwards
        (the next test checks that nobody else uses its Redis database)."""
        app = Celery("e2e-sender", broker=REDIS_URL, set_as_current=False)
        app.conf.update(task_serializer="json")
        with app.connection_for_write() as conn, app.amqp.Producer(conn) as producer:
            for n in sequences:
                app.send_task("sgme.append", kwargs=self.task(n), queue="append", producer=producer)

    def row(self) -> tables.FileRow | None:
        with self.db.reading() as conn:
            return index.find_file(conn, AGENT, "session", self.session_key)

    def waiting(self) -> int:
        with self.db.reading() as conn:
            return ledger.waiting_backlog(conn)[0]

    def anomalies(self) -> list[tables.Anomaly]:
        with self.db.reading() as conn:
            return anomalies.listed(conn, kinds=list(ORDER_KINDS))

    def wait_flushed(self, messages: int, *, timeout: float) -> tables.FileRow:
        """Wait until the session's file holds ``messages`` messages and nothing waits."""

        def done() -> tables.FileRow | None:
            row = self.row()
            if row is None or row.flushed_seq < messages or row.next_seq - 1 > row.flushed_seq:
                return None
            return row if self.waiting() == 0 else None

        found: tables.FileRow = harness.wait_until(
            done, timeout=timeout, what=f"{messages} messages in the file", check=self.alive
        )
        return found

    def contents(self, row: tables.FileRow) -> list[str]:
        got = reader.messages(self.db, self.data_dir, row.file_id, limit=10_000)
        assert [m.seq for m in got] == list(range(1, len(got) + 1))
        return [m.content for m in got]

    def fsck_ok(self) -> None:
        for proc in self.children:
            proc.stop()
        assert '"ok": true' in self.procs.run(["fsck", "--json", *self.args], self.env)

    def close(self) -> None:
        self.db.dispose()


@pytest.fixture
def deploy(tmp_path: Path, production: tuple[harness.Procs, str, Any]) -> Iterator[Deploy]:
    """``deploy(**settings)``: a :class:`Deployment` with those ``SGME_*`` settings."""
    procs, database_url, _redis = production
    made: list[Deployment] = []

    def make(**settings: str) -> Deployment:
        made.append(Deployment(procs, tmp_path, database_url, **settings))
        return made[-1]

    yield make
    for found in made:
        found.close()


Deploy = Callable[..., Deployment]


def count_messages(deployment: Deployment, sequences: Iterable[int]) -> int:
    return len(deployment.expected(sequences))


def test_300_tasks_sent_back_to_back_land_once_each_in_sequence_order(deploy: Deploy) -> None:
    d = deploy()
    d.worker("worker")
    d.beat()
    rng = random.Random(300)
    order = list(range(1, 301))
    for i in range(0, 300, 25):  # a few pairs sent the wrong way round, whatever Celery does
        order[i], order[i + 1] = order[i + 1], order[i]
    for n in rng.sample(range(1, 301), 40):  # some sent twice: a redelivery, later on
        order.insert(rng.randrange(order.index(n) + 1, len(order) + 1), n)
    d.send(order)
    row = d.wait_flushed(count_messages(d, range(1, 301)), timeout=90)
    assert d.contents(row) == d.expected(range(1, 301))
    assert row.next_sequence == 301
    assert d.anomalies() == []  # a redelivery replays: nothing to record
    d.fsck_ok()


def test_a_gap_is_let_go_after_the_wait_and_the_late_task_is_recorded(deploy: Deploy) -> None:
    d = deploy(order_wait_seconds="3")
    d.worker("worker", pool="threads")
    d.beat()
    sent = [*range(1, 11), *range(12, 21)]
    d.send(sent)
    row = d.wait_flushed(count_messages(d, sent), timeout=60)
    assert d.contents(row) == d.expected(sent)
    gaps = d.anomalies()
    assert [(a.kind, a.key, a.file_id, a.count) for a in gaps] == [
        ("sequence_gap", "11", row.file_id, 1)
    ]
    assert "sequence 11 never arrived within order_wait_seconds (3 s)" in gaps[0].detail
    assert row.next_sequence == 21

    d.send([11])
    late = harness.wait_until(
        lambda: [a for a in d.anomalies() if a.kind == "sequence_late"],
        timeout=30,
        what="the late task recorded",
        check=d.alive,
    )
    assert [(a.key, a.file_id) for a in late] == [("11", row.file_id)]
    assert "not appended out of place" in late[0].detail
    after = d.row()
    assert after is not None
    assert (after.next_seq, after.flushed_seq, after.next_sequence) == (
        row.next_seq,
        row.flushed_seq,
        21,
    )
    assert d.contents(after) == d.expected(sent)
    assert len([a for a in d.anomalies() if a.kind == "sequence_gap"]) == 1
    d.send([21])
    row = d.wait_flushed(count_messages(d, [*sent, 21]), timeout=30)
    assert d.contents(row) == d.expected([*sent, 21])
    d.fsck_ok()


def test_a_worker_killed_while_tasks_wait_loses_and_doubles_nothing(deploy: Deploy) -> None:
    d = deploy(order_wait_seconds="600")
    first = d.worker("worker-1")
    d.beat()
    rng = random.Random(9)
    early = list(range(2, 151))
    rng.shuffle(early)
    d.send(early + rng.sample(early, 20))  # 1 is not sent yet: all of them wait for it
    harness.wait_until(
        lambda: d.waiting() == 149, timeout=60, what="149 tasks waiting", check=d.alive
    )
    first.kill()  # SIGKILL to the worker and its pool, as a host losing power
    d.children.remove(first)
    assert d.waiting() == 149 and d.row() is None  # held in the index, not in the dead worker

    d.worker("worker-2")
    rest = list(range(151, 301))
    rng.shuffle(rest)
    d.send([1, *rest, *rng.sample(early, 20), *rng.sample(rest, 20)])
    row = d.wait_flushed(count_messages(d, range(1, 301)), timeout=90)
    assert d.contents(row) == d.expected(range(1, 301))
    assert row.next_sequence == 301
    assert d.anomalies() == []
    with d.db.reading() as conn:
        keys = conn.execute(
            sa.select(sa.func.count()).where(tables.append_keys.c.agent_id == AGENT)
        ).scalar_one()
    assert keys == 300  # every task applied once
    d.fsck_ok()
