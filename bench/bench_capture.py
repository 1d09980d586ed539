"""What a live-capture hook costs the agent: the wall time of ``sgme capture claude-code`` run as
Claude Code runs a hook (a new process, the hook's JSON on stdin), against a real ``sgme
serve``, a server that refuses connections and one that accepts them and never answers.

    .venv/bin/python bench/bench_capture.py            # 9 runs a case (backlog cases: 3)
    .venv/bin/python bench/bench_capture.py --runs 3   # a smoke run

**A turn at a time** — each run after one more turn (a user line and an assistant line) was
written to the transcript, the way the Stop hook meets it:

- ``python -c pass``: the interpreter's own start, the baseline of the ratio column;
- SessionEnd with nothing new (the Stop hook took the last turn): what most SessionEnd runs do;
- Stop, one new turn, in a transcript of 10 turns, then of 2,000 (about 2 MB: only what the
  transcript gained is read; measured once the first reading of it was delivered);
- Stop, one new turn, the server down (it goes to the spool).

**With a backlog** — 1,000 turns (2,000 appends) waiting in the spool from runs made while the
server was down, then one more turn and a run with the server refusing connections, and with
the server hanging (each request costs what is left of the run's budget, at most 5 s); a Stop
whose transcript path is ``/dev/zero``; the first Stop on a 26 MB transcript (about 28,000
turns this version never read, the server up: what does not go in the budget is spooled).
Afterwards the server is up again and hooks run until the spool is empty: the benchmark checks
that every turn written was stored, once, before it reports.

Wall time per run (median and worst); a shared, busy machine makes the worst case noisy. A
run keeps to its budget, ``SGME_CAPTURE_SECONDS`` (10 s; a SessionEnd hook 1 s, as Claude Code
may give it as little as 1.5 s in all), counted from after the interpreter started.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)
SGME = PYTHON.with_name("sgme")
BUDGET = {"Stop": 10.0, "SessionEnd": 1.0}  #: the runs' own budgets (the defaults)


def _stamp(n: int) -> str:
    """Claude Code's: UTC, milliseconds; 10 ms apart."""
    when = dt.datetime(2026, 8, 3, 11, 18, tzinfo=dt.UTC) + dt.timedelta(milliseconds=10 * n)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Transcript:
    def __init__(self, path: Path, session: str) -> None:
        self.path, self.session, self.n = path, session, 0
        self.last: str | None = None

    def turn(self, count: int = 1) -> None:
        lines = []
        for _ in range(count):
            for role in ("user", "assistant"):
                self.n += 1
                uuid = f"{self.session[:8]}-u{self.n:07d}"
                text = f"message {self.n}: " + "words of a turn " * 20
                message: dict[str, Any] = {"role": role, "content": text}
                if role == "assistant":
                    content = [{"type": "text", "text": text}]
                    message = {"id": f"m{self.n}", "role": role, "content": content}
                record = {
                    "type": role,
                    "uuid": uuid,
                    "parentUuid": self.last,
                    "sessionId": self.session,
                    "timestamp": _stamp(self.n),
                    "message": message,
                }
                lines.append(json.dumps(record))
                self.last = uuid
        with self.path.open("a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")


def hook(env: dict[str, str], transcript: Transcript | str, event: str) -> float:
    """One hook run; its wall time. It must exit 0 and print nothing on stdout."""
    path = transcript if isinstance(transcript, str) else str(transcript.path)
    session = "dev" if isinstance(transcript, str) else transcript.session
    payload = {"session_id": session, "transcript_path": path, "hook_event_name": event}
    started = time.monotonic()
    done = subprocess.run(
        [str(SGME), "capture", "claude-code"],
        input=json.dumps(payload),
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=float(env.get("SGME_CAPTURE_SECONDS", "10")) + 60,
    )
    took = time.monotonic() - started
    assert done.returncode == 0 and not done.stdout, done.stderr
    return took


def measure(runs: int, step: Callable[[], float]) -> list[float]:
    return [step() for _ in range(runs)]


@contextlib.contextmanager
def hanging() -> Iterator[str]:
    """A server that accepts connections and never answers: its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


@contextlib.contextmanager
def server(root: Path) -> Iterator[str]:
    """A ``sgme serve`` of the benchmark's own: its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGME_")}
    serve = subprocess.Popen(
        [str(SGME), "serve", "--data-dir", str(root / "data"), "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("sgme serve did not start")
            time.sleep(0.1)
        yield url
    finally:
        serve.terminate()
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    runs = parser.parse_args().runs
    backlog_runs = min(runs, 3)
    with tempfile.TemporaryDirectory() as tmp, server(Path(tmp)) as url:
        root = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("SGME_")}
        base["XDG_CONFIG_HOME"] = str(root / "config")  # no token file but ours (none)
        env = {**base, "SGME_URL": url, "SGME_SPOOL_DIR": str(root / "spool")}
        down = {**env, "SGME_URL": f"http://127.0.0.1:{free_port()}"}
        written: dict[str, int] = {}

        def grow_and_stop(t: Transcript, env: dict[str, str] = env) -> float:
            t.turn()
            written[t.session] = t.n
            return hook(env, t, "Stop")

        first: list[tuple[str, list[float], float | None]] = [
            (
                "`python -c pass` (baseline)",
                measure(runs, lambda: _timed([str(PYTHON), "-c", "pass"])),
                None,
            )
        ]
        small = Transcript(root / "small.jsonl", "aaaaaaaa-0000-4000-8000-000000000001")
        small.turn(10)
        written[small.session] = small.n
        hook(env, small, "Stop")
        first.append(
            (
                "SessionEnd, nothing new",
                measure(runs, lambda: hook(env, small, "SessionEnd")),
                BUDGET["SessionEnd"],
            )
        )
        first.append(("Stop, 1 new turn of 10", measure(runs, lambda: grow_and_stop(small)), 10.0))
        large = Transcript(root / "large.jsonl", "bbbbbbbb-0000-4000-8000-000000000002")
        large.turn(2000)
        written[large.session] = large.n
        settle(env, root / "spool", [small, large])  # what a first reading sent and spooled
        size = large.path.stat().st_size / 1e6
        first.append(
            (
                f"Stop, 1 new turn of 2,000 ({size:.1f} MB)",
                measure(runs, lambda: grow_and_stop(large)),
                10.0,
            )
        )
        first.append(
            (
                "Stop, 1 new turn, server down (spooled)",
                measure(runs, lambda: grow_and_stop(small, down)),
                10.0,
            )
        )

        # 1,000 turns (2,000 appends) waiting in a spool of their own
        behind = {**down, "SGME_SPOOL_DIR": str(root / "backlog")}
        waiting = Transcript(root / "waiting.jsonl", "cccccccc-0000-4000-8000-000000000003")
        waiting.turn(1000)
        written[waiting.session] = waiting.n
        hook(behind, waiting, "Stop")
        second: list[tuple[str, list[float], float | None]] = []
        for event in ("Stop", "SessionEnd"):
            second.append(
                (
                    f"{event}, server refusing connections",
                    measure(
                        backlog_runs, functools.partial(_grow, waiting, behind, event, written)
                    ),
                    BUDGET[event],
                )
            )
        with hanging() as stuck:
            slow = {**behind, "SGME_URL": stuck}
            for event in ("Stop", "SessionEnd"):
                second.append(
                    (
                        f"{event}, server hanging",
                        measure(
                            backlog_runs, functools.partial(_grow, waiting, slow, event, written)
                        ),
                        BUDGET[event],
                    )
                )
        second.append(
            (
                "Stop, transcript_path /dev/zero",
                measure(backlog_runs, lambda: hook(behind, "/dev/zero", "Stop")),
                10.0,
            )
        )
        huge = Transcript(root / "huge.jsonl", "dddddddd-0000-4000-8000-000000000004")
        while not huge.path.exists() or huge.path.stat().st_size < 26e6:
            huge.turn(1000)
        written[huge.session] = huge.n
        mb = huge.path.stat().st_size / 1e6
        fresh = {**env, "SGME_SPOOL_DIR": str(root / "huge-spool")}
        second.append(
            (
                f"first Stop on a {mb:.0f} MB transcript ({huge.n // 2:,} turns)",
                [hook(fresh, huge, "Stop")],
                10.0,
            )
        )
        # the server back: the agents' next turns' hooks read what their transcripts still
        # hold and deliver every spool; every turn is stored once
        settle(env, root / "spool", [small, large])
        settle(env, root / "backlog", [waiting])
        settle(env, root / "huge-spool", [huge])
        stored = _stored(url, written)
        assert stored == written, f"stored {stored}, written {written}"
    base_time = statistics.median(first[0][1])
    _table(f"a turn at a time ({runs} runs)", first, base_time)
    print()
    _table(f"with 1,000 turns waiting ({backlog_runs} runs)", second, base_time)


def _grow(t: Transcript, env: dict[str, str], event: str, written: dict[str, int]) -> float:
    t.turn()
    written[t.session] = t.n
    return hook(env, t, event)


def _table(title: str, rows: list[tuple[str, list[float], float | None]], base: float) -> None:
    print(f"| case: {title} | median s | worst s | budget s | median vs baseline |")
    print("|---|---|---|---|---|")
    for name, times, budget in rows:
        median = statistics.median(times)
        shown = "" if budget is None else f"{budget:g}"
        print(f"| {name} | {median:.3f} | {max(times):.3f} | {shown} | {median / base:.1f}x |")


def _stored(url: str, written: dict[str, int]) -> dict[str, int]:
    """Messages stored per session (the server writes files in the background: wait)."""
    deadline = time.monotonic() + 300
    while True:
        answer = httpx.get(f"{url}/v1/files", params={"agent_id": "claude-code", "limit": 100})
        files = answer.json()["files"]
        found = {f["session_key"]: f["flushed_seq"] for f in files}
        if found == written or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def settle(env: dict[str, str], spool: Path, transcripts: list[Transcript]) -> None:
    """Stop hooks (of a longer budget) until every transcript was read to its end and the
    spool holds nothing."""
    up = {**env, "SGME_SPOOL_DIR": str(spool), "SGME_CAPTURE_SECONDS": "60"}
    deadline = time.monotonic() + 1200
    while not _caught_up(spool, transcripts):
        for t in transcripts:
            hook(up, t, "Stop")
        if time.monotonic() > deadline:
            raise SystemExit(f"{spool}: the hooks did not catch up")


def _caught_up(spool: Path, transcripts: list[Transcript]) -> bool:
    """Nothing waits in ``spool`` and every transcript was read to its end (its state)."""
    if any(spool.glob("*.jsonl")):
        return False
    read = {}
    for state in (spool / "state").glob("t-*.json"):
        found = json.loads(state.read_text())
        read[found["path"]] = found["offset"]
    return all(read.get(str(t.path)) == t.path.stat().st_size for t in transcripts)


def _timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True)
    return time.monotonic() - started


if __name__ == "__main__":
    main()
