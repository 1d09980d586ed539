"""Real processes for the end-to-end tests: ``sgme`` children with a clean environment, a
PostgreSQL database and a Redis database of the test's own, a seeded append workload sent over
HTTP, and the checks that every acknowledged message landed exactly once, in order, and was
refined into exactly the L1 items the builtin refiner finds in it.

Nothing here sleeps to synchronise: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock
import helpers
import httpx
from conftest import REDIS_URL, unavailable

from pipeline import document

ROOT = Path(__file__).resolve().parents[2]
POLL = 0.05  #: seconds between two looks at a condition

#: the settings every e2e run uses: refine each flushed message at once, sweep every second
FAST = {
    "refine_min_messages": "1",
    "refine_idle_seconds": "0",
    "sweep_interval": "1",
    "sweep_age": "1",
    "refine_dispatch_interval": "1",
}


# ---------------------------------------------------------------------------------------------
# processes


def clean_env(**settings: str) -> dict[str, str]:
    """``os.environ`` without any ``SGME_*``, plus ``SGME_<NAME>`` for each setting given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGME_")}
    env.update({f"SGME_{name.upper()}": str(value) for name, value in settings.items()})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: polls a condition (one implementation for every test: tests/helpers.py)
wait_until = functools.partial(helpers.wait_for, poll=POLL)


def sgme_argv(*args: str) -> list[str]:
    """The command line of an ``sgme`` child (this interpreter, so this checkout)."""
    return [sys.executable, "-m", "pipeline.cli", *args]


class Proc:
    """One child (an ``sgme`` command unless ``argv`` is given), its output in a log file."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        log_dir: Path,
        *,
        argv: list[str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                argv or sgme_argv(*args),
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: see :meth:`_kill_group`
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 60) -> str:
        """The end of the child's output, for failure messages."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        """Fail with the child's output if it has exited."""
        if not self.alive():
            raise AssertionError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL to the child and everything it started (as a host losing power would),
        and reap."""
        self._kill_group()
        self.popen.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM; SIGKILL if it has not exited after ``timeout`` seconds. Whatever it
        started and left behind (a pool's or a supervisor's children) is killed too, so no
        process of this test outlives it and holds the next test's Redis database."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        self._kill_group()
        self.popen.wait(10)

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


class Procs:
    """The children of one test; :meth:`close` (in a finalizer) stops every one."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._all: list[Proc] = []

    def start(
        self, name: str, args: list[str], env: dict[str, str], *, argv: list[str] | None = None
    ) -> Proc:
        """Start ``sgme ARGS`` (or the program ``argv``) as the child ``name``."""
        proc = Proc(name, args, env, self.log_dir, argv=argv)
        self._all.append(proc)
        return proc

    def run(self, args: list[str], env: dict[str, str], timeout: float = 60.0) -> str:
        """Run a one-shot ``sgme`` command to completion; its stdout (fails on exit != 0)."""
        done = subprocess.run(
            sgme_argv(*args),
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"sgme {' '.join(args)}: {done.stderr}{done.stdout}"
        return done.stdout

    def close(self) -> None:
        """Stop every child still running, newest first (a kill if SIGTERM is not enough)."""
        for proc in reversed(self._all):
            with contextlib.suppress(Exception):
                proc.stop(timeout=10)


def wait_healthy(client: httpx.Client, proc: Proc, timeout: float = 30.0) -> None:
    """Wait until the API child answers ``GET /v1/health`` with 200."""

    def healthy() -> bool:
        try:
            return client.get("/v1/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, timeout=timeout, what=f"{proc.name} to answer", check=proc.check_alive)


def wait_worker(client: httpx.Client, *, timeout: float, check: Callable[[], None]) -> None:
    """Wait until a Celery worker consumes: a probe append (its own agent and session, never
    counted by the checks below) gets flushed."""
    probe = {
        "agent_id": PROBE_AGENT,
        "session_key": f"probe-{uuid.uuid4().hex}",
        "messages": [{"role": "user", "content": "probe"}],
    }
    answer = client.post("/v1/append", json=probe)
    assert answer.status_code == 202, answer.text
    file_id = answer.json()["file_id"]

    def flushed() -> bool:
        return bool(client.get(f"/v1/files/{file_id}").json()["flushed_seq"] == 1)

    wait_until(flushed, timeout=timeout, what="a worker to flush a probe append", check=check)


# ---------------------------------------------------------------------------------------------
# a PostgreSQL database and a Redis database of the test's own


#: how long a test waits for another test (of this run's other xdist worker, or of another
#: run on this machine) to finish with the Redis database
REDIS_WAIT = 600.0


@contextlib.contextmanager
def redis_database() -> Iterator[Any]:
    """The tests' Redis database (number 15 of :data:`conftest.REDIS_URL`), emptied before
    and after, and held by one test at a time: a lock file keyed by the URL, whichever xdist
    worker or test run the test is in. Only that database is ever flushed; skipped off CI when
    Redis does not answer."""
    digest = hashlib.sha256(REDIS_URL.encode()).hexdigest()[:12]
    lock = filelock.FileLock(Path(tempfile.gettempdir()) / f"sgme-tests-redis-{digest}.lock")
    try:
        lock.acquire(timeout=REDIS_WAIT)
    except filelock.Timeout:
        unavailable(f"Redis database {REDIS_URL} stayed in use by other tests for {REDIS_WAIT} s")
    try:
        with _redis_database() as client:
            yield client
    finally:
        lock.release()


@contextlib.contextmanager
def _redis_database() -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    db = str(client.connection_pool.connection_kwargs.get("db", 0))

    def others() -> list[dict[str, Any]]:
        me = client.client_id()
        return [c for c in client.client_list() if c["db"] == db and int(c["id"]) != me]

    try:
        # the connections of the previous test's children may take a moment to go away (a
        # worker's warm shutdown, the processes of `sgme api --workers N` after their parent)
        deadline = time.monotonic() + 15
        while (busy := others()) and time.monotonic() < deadline:
            time.sleep(POLL)
    except redis.RedisError as exc:
        client.close()
        unavailable(f"Redis not reachable at {REDIS_URL}: {exc}")
    if busy:
        # Another test session's workers would take this test's tasks (and it would wipe
        # theirs): the results would mean nothing.
        client.close()
        unavailable(
            f"Redis database {db} is in use by {len(busy)} other connection(s) from "
            f"{_owners(busy)}: is another test session running?"
        )
    client.flushdb()
    try:
        yield client
    finally:
        with contextlib.suppress(redis.RedisError):
            client.flushdb()
        client.close()


def _owners(connections: list[dict[str, Any]]) -> str:
    """The local processes behind Redis connections (their command lines, from ``ss``), for
    the message that names who holds the tests' database."""
    ports = {c["addr"].rsplit(":", 1)[-1] for c in connections}
    try:
        listing = subprocess.run(
            ["ss", "-Htnp"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ", ".join(sorted(c["addr"] for c in connections)[:3])
    pids = set()
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[3].rsplit(":", 1)[-1] in ports:
            pids.update(re.findall(r"pid=(\d+)", fields[5]))
    described = []
    for pid in sorted(pids):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        described.append(f"pid {pid}: {cmdline.decode(errors='replace')[:160]}")
    return "; ".join(described) or ", ".join(sorted(c["addr"] for c in connections)[:3])


# ---------------------------------------------------------------------------------------------
# the workload

BASE_TS = dt.datetime(2026, 8, 3, 11, 18, 6, tzinfo=dt.UTC)
AGENT = "e2e-agent"
PROBE_AGENT = "e2e-probe"  #: :func:`wait_worker`'s appends; not part of any workload


def make_message(n: int, rng: random.Random) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Message number ``n`` of the workload and the ``(kind, content)`` items the builtin
    refiner must find in it — worked out by hand from the content, not by running it."""
    ts = document.format_ts(BASE_TS + dt.timedelta(seconds=n, microseconds=n * 1000 % 999_000))
    shape = rng.choice(
        ("preference", "chatter", "profile", "decision", "answer", "tool", "code", "chinese")
    )
    if shape == "preference":
        text = f"I prefer tea number {n}."
        return {"role": "user", "content": text, "ts": ts}, [("preference", text)]
    if shape == "chatter":
        text = f"Just chatter {n}, nothing worth keeping."
        return {"role": "user", "content": text, "ts": ts}, []
    if shape == "profile":
        text = f"Good morning {n}. My name is Ada {n}. See you."
        return {"role": "user", "content": text, "ts": ts}, [("profile", f"My name is Ada {n}.")]
    if shape == "decision":
        text = f"We decided to use plan {n}."
        return {"role": "assistant", "content": text, "ts": ts}, [("decision", text)]
    if shape == "answer":
        return {"role": "assistant", "content": f"Sure, here is answer {n}.", "ts": ts}, []
    if shape == "tool":
        message = {
            "role": "tool",
            "tool_name": "search",
            "content": f"result {n}: 3 hits\nsecond line of output",
            "ts": ts,
        }
        return message, [("tool_result", f"search: result {n}: 3 hits")]
    if shape == "code":
        # Fenced code is not prose (no item), and its comment line looks like a heading to a
        # loose reader: the writer escapes it and the reader gives it back unchanged.
        text = (
            f"Look at this {n}:\n\n```python\n# I prefer spaces {n}\n"
            "# Display the results to the user\nprint(1)\n```"
        )
        return {"role": "user", "content": text, "ts": ts}, []
    text = f"我喜欢绿茶{n}号。"
    return {"role": "user", "content": text, "ts": ts}, [("preference", text)]


@dataclasses.dataclass
class Session:
    """One session of the workload: what was sent, in order, and what was acknowledged."""

    key: str
    batches: list[list[dict[str, Any]]]
    expected_items: dict[int, list[tuple[str, str]]]  #: by seq (1-based position)
    metadata: dict[str, Any]
    file_id: str | None = None
    acked: list[str] = dataclasses.field(default_factory=list)  #: source_refs, in order
    acked_batches: int = 0

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for batch in self.batches for m in batch]


def make_workload(*, sessions: int, messages: int, seed: int) -> list[Session]:
    """``messages`` messages over ``sessions`` sessions, in batches of 1–10."""
    rng = random.Random(seed)
    per_session = [messages // sessions + (i < messages % sessions) for i in range(sessions)]
    run = uuid.uuid4().hex[:8]
    result, n = [], 0
    for i, count in enumerate(per_session):
        batches: list[list[dict[str, Any]]] = []
        expected: dict[int, list[tuple[str, str]]] = {}
        seq = 0
        while seq < count:
            size = min(rng.randint(1, 10), count - seq)
            batch = []
            for _ in range(size):
                n += 1
                seq += 1
                message, items = make_message(n, rng)
                batch.append(message)
                expected[seq] = items
            batches.append(batch)
        result.append(
            Session(
                key=f"e2e-{run}-{i:03d}",
                batches=batches,
                expected_items=expected,
                metadata={"app": "e2e", "session": str(i)},
            )
        )
    return result


class Load:
    """Sends a workload over HTTP from ``clients`` threads; each session belongs to one thread,
    which sends its batches in order (so a session's file order is its send order), interleaving
    its sessions at random. Every append carries an idempotency key and is retried on
    connection errors and 5xx answers until ``deadline``: a server killed mid-request answers
    the retry from the key, so an append is acknowledged exactly once."""

    def __init__(
        self, base_url: str, sessions: list[Session], *, clients: int = 4, seed: int = 1
    ) -> None:
        self.base_url = base_url
        self.sessions = sessions
        self.clients = clients
        self.seed = seed
        self.errors: list[BaseException] = []
        self.retries = 0
        #: how many answers of each status the clients got (retries included)
        self.statuses: collections.Counter[int] = collections.Counter()
        self.acked_messages = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.deadline = 0.0

    @property
    def total_messages(self) -> int:
        return sum(len(s.messages) for s in self.sessions)

    def start(self, *, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        for t in range(self.clients):
            mine = self.sessions[t :: self.clients]
            thread = threading.Thread(
                target=self._client, args=(mine, random.Random(self.seed + t)), daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def join(self) -> None:
        """Wait for every client thread; re-raise the first error one of them hit."""
        for thread in self._threads:
            thread.join(max(0.0, self.deadline - time.monotonic()) + 5)
            assert not thread.is_alive(), "a client thread is still sending after its deadline"
        if self.errors:
            raise self.errors[0]

    def _client(self, sessions: list[Session], rng: random.Random) -> None:
        try:
            with httpx.Client(base_url=self.base_url, timeout=10) as client:
                todo = [s for s in sessions if s.batches]
                while todo:
                    session = rng.choice(todo)
                    self._append(client, session)
                    if session.acked_batches == len(session.batches):
                        todo.remove(session)
        except BaseException as exc:
            self.errors.append(exc)

    def _append(self, client: httpx.Client, session: Session) -> None:
        number = session.acked_batches
        body: dict[str, Any] = {
            "agent_id": AGENT,
            "session_key": session.key,
            "idempotency_key": f"{session.key}/{number}",
            "messages": session.batches[number],
        }
        if number == 0:
            body["metadata"] = session.metadata
        while True:
            try:
                response = client.post("/v1/append", json=body)
                with self._lock:
                    self.statuses[response.status_code] += 1
                if response.status_code < 500:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > self.deadline:
                raise AssertionError(f"append {body['idempotency_key']} not acknowledged in time")
            with self._lock:
                self.retries += 1
            time.sleep(POLL)  # back off before retrying; not a synchronisation
        assert response.status_code == 202, response.text
        answer = response.json()
        if session.file_id is None:
            session.file_id = answer["file_id"]
        assert answer["file_id"] == session.file_id
        session.acked.extend(answer["source_refs"])
        session.acked_batches += 1
        with self._lock:
            self.acked_messages += len(answer["source_refs"])


# ---------------------------------------------------------------------------------------------
# waiting and checking


def list_files(client: httpx.Client) -> list[dict[str, Any]]:
    """Every file row of the workload's agent, through ``GET /v1/files`` (paged)."""
    files: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000, "agent_id": AGENT}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/files", params=params)
        assert page.status_code == 200, page.text
        data = page.json()
        files.extend(data["files"])
        cursor = data["next_cursor"]
        if not cursor:
            return files


def settled(client: httpx.Client, sessions: list[Session]) -> bool:
    """True when every session's file holds all its acknowledged messages and is refined."""
    try:
        rows = {row["file_id"]: row for row in list_files(client)}
    except httpx.TransportError:
        return False
    for s in sessions:
        row = rows.get(s.file_id or "")
        if row is None or row["flushed_seq"] != len(s.acked) or row["status"] != "refined":
            return False
    return True


def wait_settled(
    client: httpx.Client,
    sessions: list[Session],
    *,
    timeout: float,
    check: Callable[[], None] | None = None,
) -> None:
    """Poll ``GET /v1/files`` until :func:`settled`; the stuck files in the failure message."""
    try:
        wait_until(
            lambda: settled(client, sessions),
            timeout=timeout,
            what="every file flushed and refined",
            check=check,
        )
    except AssertionError as exc:
        rows = {row["file_id"]: row for row in list_files(client)}
        keys = (
            "file_id",
            "status",
            "next_seq",
            "flushed_seq",
            "last_refined_seq",
            "flush_pending",
            "refine_epoch",
            "refine_lease_until",
            "flushed_at",
            "refined_at",
        )
        stuck = [
            {k: rows.get(s.file_id or "", {}).get(k) for k in keys} | {"acked": len(s.acked)}
            for s in sessions
            if s.file_id not in rows
            or rows[s.file_id]["flushed_seq"] != len(s.acked)
            or rows[s.file_id]["status"] != "refined"
        ]
        raise AssertionError(f"{exc}; {len(stuck)} files stuck, e.g. {stuck[:5]}") from None


def _as_message(sent: dict[str, Any], seq: int) -> document.Message:
    return document.Message(
        role=sent["role"],
        content=sent["content"],
        ts=sent["ts"],
        tool_name=sent.get("tool_name"),
        seq=seq,
    )


def check_files(client: httpx.Client, sessions: list[Session]) -> None:
    """Every acknowledged message is in its file exactly once, in send order, byte for byte."""
    rows = {row["file_id"]: row for row in list_files(client)}
    assert len(rows) == len(sessions), "a file exists that no acknowledged append created"
    for s in sessions:
        assert s.file_id is not None
        sent = s.messages
        assert s.acked_batches == len(s.batches)
        # the API acknowledged each message once, with seqs 1..n in the order they were sent
        assert s.acked == [f"{s.file_id}:{seq}" for seq in range(1, len(sent) + 1)]
        row = rows[s.file_id]
        assert (row["session_key"], row["agent_id"]) == (s.key, AGENT)
        assert row["flushed_seq"] == row["last_refined_seq"] == len(sent)
        assert row["next_seq"] == len(sent) + 1 and row["pending_messages"] == 0
        assert row["status"] == "refined"

        got = client.get(f"/v1/files/{s.file_id}/messages", params={"limit": 1000})
        assert got.status_code == 200, got.text
        stored = got.json()["messages"]
        assert [m["source_ref"] for m in stored] == s.acked
        assert [(m["role"], m["content"], m["ts"], m["tool_name"]) for m in stored] == [
            (m["role"], m["content"], m["ts"], m.get("tool_name")) for m in sent
        ]

        raw = client.get(f"/v1/files/{s.file_id}/raw")
        assert raw.status_code == 200, raw.text
        header = document.Header(
            file_id=s.file_id,
            session_key=s.key,
            agent_id=AGENT,
            source_type="session",
            started_at=sent[0]["ts"],
            metadata=s.metadata,
        )
        expected = document.render(header, [_as_message(m, i + 1) for i, m in enumerate(sent)])
        assert raw.content == expected.encode("utf-8"), f"raw bytes of {s.key} differ"
        assert row["flushed_bytes"] == len(raw.content)


def list_l1(client: httpx.Client) -> list[dict[str, Any]]:
    """Every L1 item of the workload's agent, through ``GET /v1/l1`` (paged)."""
    items: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.get("/v1/l1", params={"after": after, "limit": 1000, "agent_id": AGENT})
        assert page.status_code == 200, page.text
        data = page.json()
        items.extend(data["items"])
        if data["next_after"] is None:
            return items
        after = data["next_after"]


def check_l1(client: httpx.Client, sessions: list[Session]) -> int:
    """The L1 items are exactly what the builtin refiner finds in the content sent — no item
    missing, none twice — and every source_ref resolves to the message it came from."""
    expected: set[tuple[str, str, str, tuple[str, ...]]] = set()
    by_ref: dict[str, dict[str, Any]] = {}
    for s in sessions:
        for seq, message in enumerate(s.messages, start=1):
            ref = f"{s.file_id}:{seq}"
            by_ref[ref] = message
            for kind, content in s.expected_items[seq]:
                expected.add((s.file_id or "", kind, content, (ref,)))
    items = list_l1(client)
    got = [(i["file_id"], i["kind"], i["content"], tuple(i["source_refs"])) for i in items]
    assert len(got) == len(set(got)), "an L1 item was stored twice"
    assert set(got) == expected, (
        f"missing {sorted(expected - set(got))[:5]}, unexpected {sorted(set(got) - expected)[:5]}"
    )
    for item in items:
        assert item["agent_id"] == AGENT and item["refiner"] == "builtin"
        for ref in item["source_refs"]:
            found = client.get(f"/v1/refs/{ref}", params={"context": 0})
            assert found.status_code == 200, found.text
            message = found.json()["message"]
            assert message["source_ref"] == ref
            assert message["content"] == by_ref[ref]["content"]
    return len(items)


def check_all(client: httpx.Client, sessions: list[Session]) -> int:
    """:func:`check_files` and :func:`check_l1`; the number of L1 items."""
    check_files(client, sessions)
    return check_l1(client, sessions)
