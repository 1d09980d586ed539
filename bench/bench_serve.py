"""What ``sgme serve``'s work costs, tree against tree, in alternating runs: the CPU of a flush
round, and the server under ``wrk`` with the CPU it spent an append.

* ``round``: a round of the service's flusher (``Flusher.round``, then
  ``Service.follow_up``) of ``--files`` sessions holding one acknowledged message each
  (refinement off), ``--rounds-per-run`` times in a fresh subprocess per run: CPU µs a file.
  The flush rounds are what ``sgme serve`` does for every kicked file (docs/design.md §3).
* ``wrk``: a fresh ``sgme serve`` per run (the bench's settings: ``refine_idle_seconds`` 1),
  ``wrk -t2 -c50`` with bench_http's script (50 sessions, one short message an append), 2 s
  of warm-up then ``--seconds`` measured; appends a second, the server process' CPU µs an
  append (``/proc``: every thread, the in-process worker included) and ``wrk``'s p99. With
  ``--wait-flushed`` every append asks ``?wait=flushed``, and the answers that were not 200
  (acknowledged only: their flush failed) are counted.

* ``production`` (only with ``--only production``): PostgreSQL + Redis of each tree, as
  bench_http runs it (``sgme api``, ``sgme worker --pool threads --concurrency 4``, ``sgme
  beat``, a database of the run's own), under the same ``wrk``: appends a second, p99, and
  the CPU the API and the worker processes spent an append (``/proc``, every thread) and
  the deadlocks PostgreSQL broke during the measured run (``pg_stat_database``).

Each tree runs once per round, rounds alternate the trees, and every run is printed: on a
shared machine only a range over alternating runs says more than the noise.

    .venv/bin/python bench/bench_serve.py [--baseline DIR ...] [--runs 3]
                                          [--only round|wrk|production]
                                          [--wait-flushed]

``DIR`` is a tree of other code (``git archive REV pipeline workers | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import subrun

ROOT = Path(__file__).resolve().parents[1]


def round_case(files: int, rounds: int) -> dict[str, float]:
    """In this process, on the package importable here: CPU µs a file of a flush round."""
    from pipeline import runtime, settings, validation

    class Queue:
        def submit(self, claim: object) -> None:
            return None

        def kick(self, file_id: str) -> None:
            return None

    off = {"SGME_REFINE_MIN_MESSAGES": "1000000", "SGME_REFINE_IDLE_SECONDS": "1000000"}
    with tempfile.TemporaryDirectory(prefix="sgme-rounds-") as tmp:
        conf = settings.Settings.load(environ=off, data_dir=str(Path(tmp) / "data"))
        rt = runtime.Runtime.open(conf, migrate=True)
        service = rt.service(Queue())
        text = "Just chatter 1234, nothing more: the deploy moved to Friday."

        def acknowledged() -> list[str]:
            ids = []
            for f in range(files):
                messages = [{"role": "user", "content": text}]
                body = {"agent_id": "bench", "session_key": f"s{f}", "messages": messages}
                appended = service.append(validation.parse_append(body, conf.limits))
                ids.append(appended.result.file_id)
            return ids

        def one_round(ids: list[str]) -> list[str]:
            """A round as ``sgme serve``'s flush threads run it, then what follows it; the
            files it left or refused."""
            flusher = getattr(service, "flusher", None)
            if flusher is None:  # older trees: the service's round, the files to flush alone
                left: list[str] = getattr(service, "flush_round")(ids)  # noqa: B009
                return left
            done = flusher.round(ids)
            service.follow_up(list(done.results.values()))
            return [*done.left, *done.errors]

        try:
            for _ in range(3):  # the files made and the statements prepared, untimed
                one_round(acknowledged())
            cpu = 0.0
            for _ in range(rounds):
                ids = acknowledged()
                started = time.process_time()
                left = one_round(ids)
                cpu += time.process_time() - started
                if left:
                    raise SystemExit(f"files left or refused: {left}")
        finally:
            rt.close()
    return {"cpu us a file": cpu / (rounds * files) * 1e6}


def wrk_case(code: Path, seconds: float, tmp: Path, *, wait: bool = False) -> dict[str, float]:
    """A fresh ``sgme serve`` of ``code`` (bench_http's settings) under bench_http's ``wrk``,
    with the server's CPU; with ``wait``, every append asks ``?wait=flushed``."""
    import bench_http  # here, not above: it imports the tests' harness, and with it pipeline
    import harness

    data = Path(tempfile.mkdtemp(prefix="sgme-serve-", dir=tmp))
    port = harness.free_port()
    serve = ["serve", "--data-dir", str(data), "--port", str(port), "--log-level", "warning"]
    boot = f"import sys; sys.path.insert(0, {str(code)!r}); from pipeline.cli import main; "
    argv = [sys.executable, "-c", boot + "sys.exit(main())", *serve]
    children = harness.Procs(tmp / "logs")
    try:
        proc = children.start("serve", serve, harness.clean_env(**bench_http.SETTINGS), argv=argv)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url) as client:
            harness.wait_healthy(client, proc, timeout=60)
        path = "/v1/append?wait=flushed" if wait else "/v1/append"
        name = f"sgme serve of {code}"
        found = bench_http.run_wrk(name, url, seconds, 50, tmp, pid=proc.pid, path=path)
    finally:
        children.close()
        shutil.rmtree(data, ignore_errors=True)
    assert found.cpu_us is not None
    return {
        "appends/s": found.rate,
        "cpu us an append": found.cpu_us,
        "p99 ms": found.p99_ms,
        "non-2xx": found.non2xx,
        # answered 2xx but not 200: acknowledged only, their flush failed (wait=flushed)
        "not in the file": found.answers - found.ok200 if wait else 0,
    }


def production_case(code: Path, seconds: float, tmp: Path) -> dict[str, float]:
    """PostgreSQL + Redis of ``code`` as bench_http runs them (``sgme api``, ``sgme worker
    --pool threads``, ``sgme beat``; a database and a Redis database of the run's own) under
    bench_http's ``wrk``, with the deadlocks PostgreSQL broke during the measured run."""
    import bench_http  # here, not above: it imports the tests' harness, and with it pipeline
    import harness
    import sqlalchemy as sa
    from conftest import scratch_database

    from pipeline import database

    boot = f"import sys; sys.path.insert(0, {str(code)!r}); from pipeline.cli import main; "
    argv = [sys.executable, "-c", boot + "sys.exit(main())"]
    data = Path(tempfile.mkdtemp(prefix="sgme-production-", dir=tmp))
    children = harness.Procs(tmp / "logs")
    with scratch_database("sgme_bench") as url, harness.redis_database():
        env = harness.clean_env(**bench_http.SETTINGS)
        common = ["--data-dir", str(data), "--database-url", url]
        broker = ["--broker-url", bench_http.REDIS_URL, "--log-level", "warning"]
        engine = sa.create_engine(database.normalize_url(url))
        deadlocks = sa.text(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
        try:
            migrate = [*argv, "migrate", *common]
            subprocess.run(migrate, env=env, check=True, capture_output=True, timeout=120)
            port = harness.free_port()
            pids = {}
            for name, args in (
                ("worker", ["worker", *common, *broker, "--pool", "threads", "--concurrency", "4"]),
                ("beat", ["beat", *common, *broker]),
                ("api", ["api", *common, *broker, "--port", str(port)]),
            ):
                proc = children.start(name, args, env, argv=[*argv, *args])
                pids[name] = proc.pid
            url_api = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=url_api) as client:
                harness.wait_healthy(client, proc, timeout=60)
            with engine.connect() as conn:
                before = conn.execute(deadlocks).scalar_one()
            found = bench_http.run_wrk(
                f"PostgreSQL + Redis of {code}",
                url_api,
                seconds,
                50,
                tmp,
                pid=pids["api"],
                others=[pids["worker"]],
            )
            time.sleep(1.0)  # a backend reports its counts when its transaction ends
            with engine.connect() as conn:
                after = conn.execute(deadlocks).scalar_one()
        finally:
            children.close()
            engine.dispose()
            shutil.rmtree(data, ignore_errors=True)
    return {
        "appends/s": found.rate,
        "p99 ms": found.p99_ms,
        "api cpu us an append": found.cpu_us or 0.0,
        "worker cpu us an append": found.others_cpu_us[0],
        "non-2xx": found.non2xx,
        "deadlocks": after - before,
    }


def _round_run(code: Path, files: int, rounds: int) -> dict[str, float]:
    argv = [sys.executable, __file__, "--case", "--code", str(code)]
    argv += ["--files", str(files), "--rounds-per-run", str(rounds)]
    return subrun.case(argv, f"the flush rounds of {code}")


def _under_wrk(
    trees: dict[str, Path], runs: int, case: Callable[[Path, Path], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """``case(code, tmp)`` of each tree, ``runs`` times, the trees alternating."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (make wrk)")
    found: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="sgme-bench-serve-") as tmp:
        for _ in range(runs):
            for name, code in trees.items():
                found[name].append(case(code, Path(tmp)))
    return found


def _table(title: str, keys: list[str], runs: dict[str, list[dict[str, float]]]) -> None:
    print(f"\n{title}\n")
    print("| code | " + " | ".join(f"{k} (each run)" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, found in runs.items():
        cells = [", ".join(f"{run[k]:,.0f}" for run in found) for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, action="append", default=[])
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each tree")
    parser.add_argument("--only", choices=("round", "wrk", "production"))
    parser.add_argument("--files", type=int, default=50, help="files a flush round")
    parser.add_argument("--rounds-per-run", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=6.0, help="measured under wrk")
    parser.add_argument(
        "--wait-flushed", action="store_true", help="under wrk, every append ?wait=flushed"
    )
    parser.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # one run of the flush rounds, in this process, on the code in args.code
        sys.path.insert(0, str(args.code))
        print(json.dumps(round_case(args.files, args.rounds_per_run)))
        return 0
    trees = {"sgme": ROOT, **{str(path): path for path in args.baseline}}
    if args.only == "production":
        stacks = _under_wrk(
            trees, args.runs, lambda code, tmp: production_case(code, args.seconds, tmp)
        )
        _table(
            f"PostgreSQL + Redis under wrk (50 connections, {args.seconds:g} s a run)",
            [
                "appends/s",
                "p99 ms",
                "api cpu us an append",
                "worker cpu us an append",
                "non-2xx",
                "deadlocks",
            ],
            stacks,
        )
        return 0
    if args.only != "wrk":
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, code in trees.items():
                rounds[name].append(_round_run(code, args.files, args.rounds_per_run))
        _table(
            f"flush rounds of {args.files} one-message files, {args.rounds_per_run} a run",
            ["cpu us a file"],
            rounds,
        )
    if args.only != "round":
        served = _under_wrk(
            trees,
            args.runs,
            lambda code, tmp: wrk_case(code, args.seconds, tmp, wait=args.wait_flushed),
        )
        waited = ", ?wait=flushed" if args.wait_flushed else ""
        _table(
            f"sgme serve under wrk (50 connections{waited}, {args.seconds:g} s a run)",
            ["appends/s", "cpu us an append", "p99 ms", "non-2xx"]
            + (["not in the file"] if args.wait_flushed else []),
            served,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
