"""HTTP end-to-end benchmark: ``POST /v1/append`` throughput and acknowledgement latency with
50 concurrent clients, and how long acknowledged appends take to reach the file (flushed) and
L1 (refined).

Servers, each started as its own process and hammered the same way:

- ``trivial``: a FastAPI endpoint on uvicorn that does nothing (``return {"ok": True}``) — the
  ceiling of the HTTP stack and of these clients on this machine;
- ``durable``: a FastAPI endpoint on uvicorn doing one durable SQLite insert per request (WAL,
  ``synchronous=FULL``, a connection per thread, the commit before the answer) — the plain
  way to store a message safely; the peer the targets compare with;
- ``embedded``: ``sgme serve`` (SQLite, in-memory broker, in-process worker and beat);
- ``postgres+redis``: ``sgme migrate``, ``sgme api``, ``sgme worker --pool threads`` and
  ``sgme beat`` on a PostgreSQL database made for the run and Redis database 15 (emptied before
  and after); skipped with a note when either is unreachable;
- ``postgres+redis, 2 API processes``: the same with ``sgme api --workers 2``.

Per server: a warm-up, then ``--clients`` closed-loop clients for ``--seconds`` (the maximum
rate), then the same clients rate-limited to half that rate (latency measured from each
request's scheduled send time, so a client falling behind counts). Each append is one message
to the client's own session. Ack→flushed and ack→refined: a poller reads ``GET /v1/files``;
an append counts as flushed at the ``flushed_at`` of the first look that shows its seq flushed
(the same for refined), compared with the client's wall-clock acknowledgement time (both UTC,
same host clock); a flush that the poller sees late is counted late, never early.

Clients are threads with an httpx.Client each, in ``--client-procs`` processes (servers and
clients share this machine's cores; httpx.AsyncClient was slower, see below). The sgme
processes run with the default settings except ``refine_idle_seconds=1`` (``--fast``: what the
e2e tests use, refining every flush). Targets (issue 22): >= 1.5x the durable endpoint with
these clients; under ``wrk`` >= 1.5x the durable endpoint and >= 0.5x the trivial one; the p99
acknowledgement at half the measured maximum rate reported.

With the Python clients the table also gives the CPU an append of the client processes and of
the server's processes (``/proc``, every thread, from the phase's common start to its clients'
end), and the *CPU ceiling*: the appends a second the machine's cores allow at those two costs
together. The clients and the server share the cores, so a server cannot be measured past its
ceiling with these clients, and a ratio target is out of reach of a server whose ceiling is
below it. Work a server leaves for after the clients' end (``sgme serve``'s flushes and
refinement still running) is not in its CPU, so its ceiling is if anything too high.

``--baseline DIR`` adds ``embedded, unchanged code``: ``sgme serve`` importing the package
from ``DIR`` (``git archive main pipeline workers | tar -x -C DIR``), measured in the same run.
``--wrk`` also drives every server with ``wrk`` (Debian's package: a C load generator that is
not itself the bottleneck, unlike Python clients on two shared cores): 2 threads, the same 50
connections, each request one message to one of 50 sessions; its rate and latency are
reported in a second table (``wrk`` cannot hold a rate, so its latencies are at the maximum
rate; the half-rate p99 comes from the Python clients).

The peers run on uvicorn with its defaults, which pick uvloop and httptools when installed
(they are dependencies of sgme, which runs on both): the same server stack as ``sgme serve``.

    .venv/bin/python bench/bench_http.py [--quick] [--only embedded] [--rate 100] [--fast]
                                         [--baseline DIR] [--wrk] [--no-python-clients]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
#: the same services as the tests (SGME_TEST_POSTGRES_URL, SGME_TEST_REDIS_URL)
POSTGRES_ADMIN_URL = os.environ.get(
    "SGME_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("SGME_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
#: the product defaults (config/default.yaml), except that a session quiet for a second is
#: refined (default 60 s) so that ack→refined ends within a run; --fast refines every flush
SETTINGS = {"refine_idle_seconds": "1"}
FAST = {  # what the e2e tests use: refine each flushed message at once, sweep every second
    "refine_min_messages": "1",
    "refine_idle_seconds": "0",
    "sweep_interval": "1",
    "sweep_age": "1",
    "refine_dispatch_interval": "1",
}
_FAST = False  #: set by --fast
BASELINE = """
import sys
import uvicorn
from fastapi import FastAPI

app = FastAPI()

@app.post("/v1/append")
async def append() -> dict:
    return {"ok": True}

@app.get("/v1/health")
async def health() -> dict:
    return {"ok": True}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""
DURABLE = """
import sqlite3
import sys
import threading

import uvicorn
from fastapi import FastAPI, Request

PATH = sys.argv[2]
setup = sqlite3.connect(PATH)
setup.execute("PRAGMA journal_mode=WAL")
setup.execute("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, body TEXT)")
setup.close()
local = threading.local()


def connection() -> sqlite3.Connection:
    conn = getattr(local, "conn", None)
    if conn is None:
        conn = local.conn = sqlite3.connect(PATH, timeout=30, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")  # the commit is on disk before the answer
    return conn


app = FastAPI()


@app.post("/v1/append")
def append(body: dict) -> dict:
    conn = connection()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO messages (body) VALUES (?)", (str(body),))
    conn.execute("COMMIT")
    return {"ok": True}


@app.get("/v1/health")
def health() -> dict:
    return {"ok": True}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


#: wrk's script: one message per request, to one of 25 sessions per wrk thread (50 in all, as
#: the Python clients), named after the run's prefix (wrk's first argument after ``--``)
WRK_SCRIPT = """
local prefix, path, id, n = "wrk", "/v1/append", 0, 0
local threads = {}
setup = function(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end
init = function(args)
  prefix = args[1] or prefix
  path = args[2] or path
end
request = function()
  n = n + 1
  local body = '{"agent_id":"bench","session_key":"' .. prefix .. '-' .. id .. '-' .. (n % 25)
    .. '","messages":[{"role":"user","content":"Just chatter ' .. n .. ', nothing more."}]}'
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  local ok200 = 0
  for _, thread in ipairs(threads) do ok200 = ok200 + (thread:get("ok200") or 0) end
  io.write(string.format(
    'WRK {"requests": %d, "seconds": %f, "non2xx": %d, "socket_errors": %d, '
    .. '"p50_ms": %f, "p99_ms": %f, "ok200": %d}\\n',
    summary.requests, summary.duration / 1e6, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, ok200))
end
"""
#: added to :data:`WRK_SCRIPT` to count the 200 answers (``?wait=flushed``: in the file), a Lua
#: call an answer that the plain runs leave out
WRK_COUNT_200 = """
ok200 = 0
response = function(status, headers, body)
  if status == 200 then ok200 = ok200 + 1 end
end
"""


@dataclasses.dataclass(frozen=True)
class Wrk:
    name: str
    rate: float  #: 2xx answers per second
    non2xx: int
    socket_errors: int
    p50_ms: float
    p99_ms: float
    #: CPU µs the server process (``run_wrk``'s ``pid``, every thread) spent a 2xx answer
    cpu_us: float | None = None
    #: 2xx answers in all, and the 200 ones (counted with ``?wait=flushed`` only: the appends
    #: answered once in the file)
    answers: int = 0
    ok200: int = 0
    #: CPU µs each of ``run_wrk``'s ``others`` (processes) spent a 2xx answer
    others_cpu_us: tuple[float, ...] = ()


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used so far, all its threads (Linux: ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def family(pid: int) -> list[int]:
    """``pid`` and its descendants now (Linux: ``/proc``): a server's processes (uvicorn's
    workers, say), whose CPU :func:`run_phase` adds up."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in task.read_text().split():
                found += family(int(child))
    return found


def run_wrk(
    name: str,
    url: str,
    seconds: float,
    clients: int,
    tmp: Path,
    *,
    pid: int | None = None,
    path: str = "/v1/append",
    others: Sequence[int] = (),
) -> Wrk:
    """``wrk`` on ``url``'s ``POST path`` (``/v1/append``, or with ``?wait=flushed``: then the
    200 answers are counted) for ``seconds`` (after a 2 s warm-up); with ``pid``, that server
    process' CPU over the measured run too, and each of ``others``' (a worker's, say)."""
    script = tmp / "append.lua"
    script.write_text(WRK_SCRIPT + (WRK_COUNT_200 if "wait=" in path else ""))
    found: dict[str, Any] = {}
    cpu = 0.0
    spent: list[float] = []
    for length in (2.0, seconds):  # a warm-up, then the measured run
        prefix = f"wrk-{uuid.uuid4().hex[:6]}"
        argv = ["wrk", "-t2", f"-c{clients}", f"-d{length:g}s", "--timeout", "30s"]
        before = process_cpu(pid) if pid else 0.0
        others_before = [process_cpu(other) for other in others]
        done = subprocess.run(
            [*argv, "-s", str(script), url, "--", prefix, path],
            capture_output=True,
            text=True,
            check=True,
            timeout=length + 60,
        )
        cpu = process_cpu(pid) - before if pid else 0.0
        spent = [process_cpu(o) - b for o, b in zip(others, others_before, strict=True)]
        line = next(x for x in done.stdout.splitlines() if x.startswith("WRK "))
        found = json.loads(line.removeprefix("WRK "))
    ok = found["requests"] - found["non2xx"]
    result = Wrk(
        name,
        ok / found["seconds"],
        found["non2xx"],
        found["socket_errors"],
        found["p50_ms"],
        found["p99_ms"],
        cpu / max(ok, 1) * 1e6 if pid else None,
        ok,
        found["ok200"],
        tuple(s / max(ok, 1) * 1e6 for s in spent),
    )
    print(f"  wrk: {result.rate:.0f} appends/s, p99 {result.p99_ms:.1f} ms", file=sys.stderr)
    return result


def print_wrk(results: list[Wrk]) -> None:
    rates = {r.name: r.rate for r in results}
    trivial = rates.get(TRIVIAL_NAME, float("nan"))
    durable = rates.get(DURABLE_NAME, float("nan"))
    print("| server (wrk) | appends/s | vs durable | vs trivial | p50 ms | p99 ms | non-2xx |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.name} | {r.rate:.0f} | {r.rate / durable:.2f} | {r.rate / trivial:.2f} | "
            f"{r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.non2xx + r.socket_errors} |"
        )
    print()
    print("Targets under wrk: >= 1.5x durable, >= 0.5x trivial.")


# ---------------------------------------------------------------------------------------------
# processes: the e2e tests' harness (tests/e2e/harness.py), one copy for tests and benchmarks

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
import harness  # noqa: E402
from conftest import scratch_database  # noqa: E402


def _env() -> dict[str, str]:
    return harness.clean_env(**(FAST if _FAST else SETTINGS))


def _wait_healthy(url: str, proc: harness.Proc) -> None:
    with httpx.Client(base_url=url) as client:
        harness.wait_healthy(client, proc, timeout=60)


# ---------------------------------------------------------------------------------------------
# clients (threads with an httpx.Client each, in child processes)
#
# httpx.AsyncClient was measured first: 25 concurrent requests on one AsyncClient managed
# ~200 requests/s against the trivial endpoint (one connection: ~500/s), while 25 threads with
# an httpx.Client each managed ~1,300/s — the async client would have been the bottleneck.


@dataclasses.dataclass(frozen=True)
class Plan:
    url: str
    clients: int
    seconds: float
    rate: float | None  #: appends/s for all clients of this process together; None: max
    prefix: str
    start_at: float  #: time.time() at which every process starts sending


Record = tuple[float, float, str, int]  #: (latency s, ack time, file_id, last_seq)


def _body(session_key: str, n: int) -> dict[str, Any]:
    content = f"I prefer tea number {n}." if n % 3 == 0 else f"Just chatter {n}, nothing more."
    return {
        "agent_id": "bench",
        "session_key": session_key,
        "messages": [{"role": "user", "content": content}],
    }


def _client(plan: Plan, i: int, out: list[Record], errors: list[str]) -> None:
    session = f"{plan.prefix}-{os.getpid()}-{i}"
    interval = plan.clients / plan.rate if plan.rate else 0.0
    # spread the rate-limited clients' first sends over one interval
    scheduled = plan.start_at + (interval * i / plan.clients)
    end = plan.start_at + plan.seconds
    n = 0
    with httpx.Client(base_url=plan.url, timeout=30) as http:
        time.sleep(max(0.0, plan.start_at - time.time()))
        while True:
            now = time.time()
            if plan.rate:
                if scheduled >= end:
                    return
                if scheduled > now:
                    time.sleep(scheduled - now)
                sent = scheduled
                scheduled += interval
            else:
                if now >= end:
                    return
                sent = now
            n += 1
            try:
                response = http.post("/v1/append", json=_body(session, n))
            except httpx.HTTPError as exc:
                errors.append(repr(exc))
                continue
            acked = time.time()
            if response.status_code >= 300:
                errors.append(f"append answered {response.status_code}: {response.text[:200]}")
                continue
            answer = response.json()
            out.append((acked - sent, acked, answer.get("file_id", ""), answer.get("last_seq", 0)))


def _client_process(plan: Plan) -> tuple[list[Record], list[str], float]:
    """The records and errors of ``plan``'s clients, and the CPU seconds this process spent
    from the common start to its clients' end (all its threads: what the clients cost the
    machine's cores, which the server shares)."""
    out: list[Record] = []
    errors: list[str] = []
    threads = [
        threading.Thread(target=_client, args=(plan, i, out, errors), daemon=True)
        for i in range(plan.clients)
    ]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, plan.start_at - time.time()))
    cpu = time.process_time()
    for thread in threads:
        thread.join(plan.start_at + plan.seconds - time.time() + 60)
    return out, errors, time.process_time() - cpu


# ---------------------------------------------------------------------------------------------
# the poller: when did each file's seqs get flushed and refined?


def _parse_utc(value: str | None) -> float | None:
    if not value:
        return None
    when = dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    return when.timestamp()


class Poller:
    """Reads ``GET /v1/files`` in a loop; per file, the (seq, time) steps of flushed_seq and
    last_refined_seq as the index recorded them (flushed_at, refined_at)."""

    def __init__(self, url: str, interval: float = 0.05) -> None:
        self.url = url
        self.interval = interval
        self.flushed: dict[str, list[tuple[int, float]]] = {}
        self.refined: dict[str, list[tuple[int, float]]] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    self._look(client)
                self._stop.wait(self.interval)

    def _look(self, client: httpx.Client) -> None:
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = client.get("/v1/files", params=params).json()
            for row in page["files"]:
                fid = row["file_id"]
                self.rows[fid] = row
                self._step(self.flushed, fid, row["flushed_seq"], row["flushed_at"])
                self._step(self.refined, fid, row["last_refined_seq"], row["refined_at"])
            cursor = page["next_cursor"]
            if not cursor:
                return

    @staticmethod
    def _step(
        steps: dict[str, list[tuple[int, float]]], fid: str, seq: int, at: str | None
    ) -> None:
        when = _parse_utc(at)
        known = steps.setdefault(fid, [])
        if when is not None and seq > 0 and (not known or seq > known[-1][0]):
            known.append((seq, when))

    def settled(self, expected: dict[str, int]) -> bool:
        """Every file has flushed and refined up to ``expected[file_id]``."""
        for fid, seq in expected.items():
            row = self.rows.get(fid)
            if row is None or row["flushed_seq"] < seq or row["last_refined_seq"] < seq:
                return False
        return True

    def when(self, steps: dict[str, list[tuple[int, float]]], fid: str, seq: int) -> float | None:
        for step_seq, at in steps.get(fid, []):
            if step_seq >= seq:
                return at
        return None


# ---------------------------------------------------------------------------------------------
# one phase, one server


@dataclasses.dataclass
class Phase:
    """What one phase measured."""

    appends: int
    seconds: float
    ack_ms: list[float]
    flushed_ms: list[float]
    refined_ms: list[float]
    #: CPU seconds of the client processes, and of the server's (``run_phase``'s ``pids``:
    #: every thread; None when not measured), from the phase's start to its clients' end
    client_cpu: float = 0.0
    server_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.appends / self.seconds

    def cpu_us(self, seconds: float | None) -> float:
        """``seconds`` of CPU in µs an append (NaN: not measured, or no append)."""
        if seconds is None or not self.appends:
            return float("nan")
        return seconds / self.appends * 1e6

    @property
    def ceiling(self) -> float:
        """The appends a second this machine's cores allow at the measured CPU an append of
        the clients and the server together: no server can be measured past it with these
        clients (they use the cores it would need)."""
        spent = self.cpu_us(self.client_cpu) + self.cpu_us(self.server_cpu)
        return (os.cpu_count() or 1) * 1e6 / spent if spent == spent else float("nan")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run_phase(
    url: str,
    *,
    clients: int,
    procs: int,
    seconds: float,
    rate: float | None,
    prefix: str,
    poller: Poller | None,
    settle: float,
    pids: Sequence[int] = (),
) -> Phase:
    """One phase of the Python clients against ``url``; with ``pids``, the CPU of those
    server processes over it too."""
    # spawned clients import httpx first: seconds on a loaded machine, and all must start together
    start_at = time.time() + 6.0
    per_proc = [clients // procs + (i < clients % procs) for i in range(procs)]
    plans = [
        Plan(url, n, seconds, rate * n / clients if rate else None, f"{prefix}-{k}", start_at)
        for k, n in enumerate(per_proc)
    ]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        pending = pool.map_async(_client_process, plans)
        time.sleep(max(0.0, start_at - time.time()))
        before = sum(map(process_cpu, pids))
        results = pending.get()
        server_cpu = sum(map(process_cpu, pids)) - before if pids else None
    records = [r for chunk, _, _ in results for r in chunk]
    failures = [e for _, errors, _ in results for e in errors]
    if failures:
        print(f"  {len(failures)} failed requests, e.g. {failures[0]}", file=sys.stderr)
    print(
        f"  {prefix.split('-')[0]}: {len(records) / seconds:.0f} appends/s, ack p50 "
        f"{_percentile([r[0] * 1000 for r in records], 50):.1f} ms",
        file=sys.stderr,
    )
    phase = Phase(
        appends=len(records),
        seconds=seconds,
        ack_ms=[r[0] * 1000 for r in records],
        flushed_ms=[],
        refined_ms=[],
        client_cpu=sum(cpu for _, _, cpu in results),
        server_cpu=server_cpu,
    )
    if poller is None:
        return phase
    last: dict[str, int] = {}
    for _, _, fid, seq in records:
        last[fid] = max(last.get(fid, 0), seq)
    deadline = time.monotonic() + settle
    while not poller.settled(last) and time.monotonic() < deadline:
        time.sleep(0.1)
    for _, acked, fid, seq in records:
        flushed = poller.when(poller.flushed, fid, seq)
        refined = poller.when(poller.refined, fid, seq)
        if flushed is not None:
            phase.flushed_ms.append((flushed - acked) * 1000)
        if refined is not None:
            phase.refined_ms.append((refined - acked) * 1000)
    return phase


@dataclasses.dataclass
class Result:
    name: str
    max: Phase
    half: Phase | None
    note: str = ""


WRK_RESULTS: list[Wrk] = []


def bench_server(
    name: str, url: str, args: argparse.Namespace, *, pipeline: bool, pids: Sequence[int] = ()
) -> Result:
    """wrk (with ``--wrk``) and the Python clients' phases against ``url``; ``pids``: the
    server's processes, whose CPU the Python clients' phases report."""
    print(f"{name}:", file=sys.stderr)
    if args.wrk:
        WRK_RESULTS.append(run_wrk(name, url, args.seconds, args.clients, Path(args.tmp)))
    if not args.python_clients:
        empty = Phase(appends=0, seconds=1, ack_ms=[], flushed_ms=[], refined_ms=[])
        return Result(name, empty, None)
    clients, procs = args.clients, args.client_procs
    run_phase(
        url,
        clients=clients,
        procs=procs,
        seconds=args.warmup,
        rate=None,
        prefix=f"warm-{uuid.uuid4().hex[:6]}",
        poller=None,
        settle=0,
    )
    poller = Poller(url) if pipeline else None
    if poller:
        poller.start()
    try:
        top = run_phase(
            url,
            clients=clients,
            procs=procs,
            seconds=args.seconds,
            rate=None,
            prefix=f"max-{uuid.uuid4().hex[:6]}",
            poller=poller,
            settle=args.settle,
            pids=pids,
        )
        half = run_phase(
            url,
            clients=clients,
            procs=procs,
            seconds=args.seconds,
            rate=args.rate or top.rate / 2,
            prefix=f"half-{uuid.uuid4().hex[:6]}",
            poller=poller,
            settle=args.settle,
            pids=pids,
        )
    finally:
        if poller:
            poller.stop()
    return Result(name, top, half)


SERVERS = ("trivial", "durable", "embedded", "baseline", "production", "production2")
TRIVIAL_NAME = "trivial FastAPI endpoint"
DURABLE_NAME = "FastAPI + one durable SQLite insert"


def run_trivial(args: argparse.Namespace, children: harness.Procs) -> Result:
    port = harness.free_port()
    argv = [sys.executable, "-c", BASELINE, str(port)]
    proc = children.start("trivial", [], _env(), argv=argv)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc)
    return bench_server(TRIVIAL_NAME, url, args, pipeline=False, pids=family(proc.pid))


def run_durable(args: argparse.Namespace, children: harness.Procs, tmp: Path) -> Result:
    port = harness.free_port()
    argv = [sys.executable, "-c", DURABLE, str(port), str(tmp / "durable.sqlite3")]
    proc = children.start("durable", [], _env(), argv=argv)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc)
    return bench_server(DURABLE_NAME, url, args, pipeline=False, pids=family(proc.pid))


def run_embedded(
    args: argparse.Namespace, children: harness.Procs, tmp: Path, *, code: Path | None = None
) -> Result:
    """``sgme serve``; with ``code``, importing the package from that tree (unchanged code)."""
    port = harness.free_port()
    common = ["--data-dir", str(tmp / ("baseline" if code else "embedded"))]
    serve = ["serve", *common, "--port", str(port), "--log-level", args.log_level]
    argv = None
    if code is not None:
        boot = f"import sys; sys.path.insert(0, {str(code)!r}); from pipeline.cli import main; "
        argv = [sys.executable, "-c", boot + "sys.exit(main())", *serve]
    proc = children.start("baseline" if code else "serve", serve, _env(), argv=argv)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc)
    name = "embedded, unchanged code" if code else "embedded (sgme serve)"
    return bench_server(name, url, args, pipeline=True, pids=family(proc.pid))


def run_production(
    args: argparse.Namespace, children: harness.Procs, tmp: Path, *, api_processes: int = 1
) -> Result:
    with scratch_database("sgme_bench") as database_url, harness.redis_database():
        env = _env()
        data = tmp / f"production-{api_processes}"
        common = ["--data-dir", str(data), "--database-url", database_url]
        broker = ["--broker-url", REDIS_URL, "--log-level", args.log_level]
        children.run(["migrate", *common], env)
        port = harness.free_port()
        worker = children.start(
            "worker",
            ["worker", *common, *broker, "--pool", "threads", "--concurrency", str(args.workers)],
            env,
        )
        beat = children.start("beat", ["beat", *common, *broker], env)
        api = children.start(
            "api",
            ["api", *common, *broker, "--port", str(port), "--workers", str(api_processes)],
            env,
        )
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, api)
        name = "postgres+redis (api+worker+beat)"
        if api_processes > 1:
            name = f"postgres+redis, {api_processes} API processes"
        pids = [p for proc in (api, worker, beat) for p in family(proc.pid)]
        try:
            return bench_server(name, url, args, pipeline=True, pids=pids)
        finally:
            children.close()


def _reachable() -> str | None:
    """Why PostgreSQL + Redis mode cannot run, or None."""
    import redis
    import sqlalchemy as sa

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        return f"Redis not reachable at {REDIS_URL}: {exc}"
    admin = sa.create_engine("postgresql+psycopg://" + POSTGRES_ADMIN_URL.split("://", 1)[1])
    try:
        with admin.connect():
            pass
    except sa.exc.SQLAlchemyError as exc:
        return f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {exc.__cause__ or exc}"
    finally:
        admin.dispose()
    return None


# ---------------------------------------------------------------------------------------------
# report


def _ms(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"  # NaN: nothing measured


def _count(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"  # NaN: nothing measured


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(results: list[Result], notes: list[str]) -> None:
    by_name = {r.name: r.max.rate for r in results}
    trivial = by_name.get(TRIVIAL_NAME, float("nan"))
    durable = by_name.get(DURABLE_NAME, float("nan"))
    header = (
        "server",
        "appends/s",
        "vs durable",
        "vs trivial",
        "client CPU µs",
        "server CPU µs",
        "CPU ceiling/s",
        "ack p50 ms",
        "ack p99 ms",
        "half rate/s",
        "half ack p50",
        "half ack p99",
        "flushed p50",
        "flushed p99",
        "refined p50",
        "refined p99",
    )
    rows = []
    for r in results:
        half = r.half
        measured = half if half and half.flushed_ms else r.max
        rows.append(
            (
                r.name,
                f"{r.max.rate:.0f}",
                f"{r.max.rate / durable:.2f}",
                f"{r.max.rate / trivial:.2f}",
                _count(r.max.cpu_us(r.max.client_cpu)),
                _count(r.max.cpu_us(r.max.server_cpu)),
                _count(r.max.ceiling),
                _ms(_percentile(r.max.ack_ms, 50)),
                _ms(_percentile(r.max.ack_ms, 99)),
                f"{half.rate:.0f}" if half else "-",
                _ms(_percentile(half.ack_ms, 50)) if half else "-",
                _ms(_percentile(half.ack_ms, 99)) if half else "-",
                _ms(_median(measured.flushed_ms)),
                _ms(_percentile(measured.flushed_ms, 99)),
                _ms(_median(measured.refined_ms)),
                _ms(_percentile(measured.refined_ms, 99)),
            )
        )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print()
    print("client / server CPU µs: CPU time an append of the client processes and of the")
    print("server's, at the maximum rate; CPU ceiling: the appends a second the machine's")
    print(f"{os.cpu_count()} CPUs allow at those two costs together (no server is measured past")
    print("it with these clients on this machine).")
    print()
    print("Targets: >= 1.5x durable (the p99 at half rate is reported).")
    for r in results:
        if r.name in (TRIVIAL_NAME, DURABLE_NAME):
            continue
        p99 = _percentile(r.half.ack_ms, 99) if r.half else float("nan")
        verdicts = [
            f"{r.max.rate / durable:.2f}x durable "
            f"({'met' if r.max.rate >= 1.5 * durable else 'missed'})",
            f"{r.max.rate / trivial:.2f}x trivial",
            f"half-rate p99 {_ms(p99)} ms",
        ]
        print(f"  {r.name}: " + "; ".join(verdicts))
    print()
    print("flushed/refined: ms from the client's acknowledgement to the index's flushed_at /")
    print("refined_at of the append's seq, at half rate; 'max' phase values below.")
    for r in results:
        if not r.max.flushed_ms:
            continue
        print(
            f"  {r.name} at max rate: flushed p50 {_ms(_median(r.max.flushed_ms))} ms, "
            f"p99 {_ms(_percentile(r.max.flushed_ms, 99))} ms; refined p50 "
            f"{_ms(_median(r.max.refined_ms))} ms, p99 {_ms(_percentile(r.max.refined_ms, 99))} ms"
        )
    for note in notes:
        print(f"note: {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (a smoke run)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--seconds", type=float, help="length of each measured phase")
    parser.add_argument(
        "--rate", type=float, help="appends/s of the rate-limited phase (default: half the max)"
    )
    parser.add_argument("--workers", type=int, default=4, help="threads of `sgme worker`")
    parser.add_argument("--log-level", default="warning", help="of the sgme processes")
    parser.add_argument("--only", choices=SERVERS, action="append")
    parser.add_argument(
        "--fast", action="store_true", help="refine every flush and sweep every second (e2e)"
    )
    parser.add_argument("--baseline", type=Path, help="a tree of the unchanged code")
    parser.add_argument("--wrk", action="store_true", help="also drive each server with wrk")
    parser.add_argument(
        "--no-python-clients",
        dest="python_clients",
        action="store_false",
        help="wrk only (with --wrk)",
    )
    args = parser.parse_args()
    if args.wrk and shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    global _FAST
    _FAST = args.fast
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    args.warmup = 1.0 if args.quick else 3.0
    args.settle = 30.0 if args.quick else 60.0
    only = set(args.only or SERVERS)

    results: list[Result] = []
    notes = [
        f"{args.clients} clients in {args.client_procs} processes (threads, httpx.Client), "
        f"{os.cpu_count()} CPUs shared by clients and servers; one message per append; "
        f"sgme log level {args.log_level}",
        f"settings: {FAST if args.fast else SETTINGS} (others: the defaults)",
    ]
    with tempfile.TemporaryDirectory(prefix="sgme-bench-") as tmp:
        args.tmp = tmp
        children = harness.Procs(Path(tmp))
        try:
            if "trivial" in only:
                results.append(run_trivial(args, children))
                children.close()
            if "durable" in only:
                results.append(run_durable(args, children, Path(tmp)))
                children.close()
            if "embedded" in only:
                results.append(run_embedded(args, children, Path(tmp)))
                children.close()
            if "baseline" in only and args.baseline:
                results.append(run_embedded(args, children, Path(tmp), code=args.baseline))
                children.close()
            for processes in (1, 2):
                if ("production" if processes == 1 else "production2") not in only:
                    continue
                why = _reachable()
                if why:
                    notes.append(f"postgres+redis skipped: {why}")
                else:
                    results.append(
                        run_production(args, children, Path(tmp), api_processes=processes)
                    )
        finally:
            children.close()
    if args.python_clients:
        print_table(results, notes)
    if WRK_RESULTS:
        print()
        print_wrk(WRK_RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
