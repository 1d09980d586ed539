"""What refinement costs an append: the CPU of claiming, reading, refining and committing a
segment, per claim and per message, against the unchanged code in the same run.

Every message is refined once, so this is paid per message like the acknowledgement and the
flush (in ``sgme serve`` under ``wrk`` it took about 30% of the appends' rate before the claim's
statements were prepared; the fifth throughput pass, in the history of docs/benchmarks.md).
The store holds ``--files`` session files of ``--messages`` flushed messages each
(``refine_min_messages``' default is 20); a round claims every due file
(``Service.dispatch``) and runs each claim as the ``refine_segment`` task does
(``Service.refine_segment``: run the builtin refiner, commit the items, dispatch the file
again). No broker: the claims go to a list. Each round runs in a fresh
subprocess, rounds interleave the trees, the best of each is kept.

    .venv/bin/python bench/bench_refine.py [--files 200] [--messages 20] [--rounds 3]
                                           [--baseline DIR]

``DIR`` is a tree of the unchanged code (``git archive REV pipeline workers | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import subrun

ROOT = Path(__file__).resolve().parents[1]


class _Jobs:
    """The queue the service sends claims to: a list, run by the caller."""

    def __init__(self) -> None:
        self.claims: list[Any] = []

    def submit(self, claim: Any) -> None:
        self.claims.append(claim)

    def kick(self, file_id: str) -> None:
        return None


def _text(f: int, i: int) -> str:
    return (
        f"Message {i} of session {f}: we decided to move the index to PostgreSQL, keep Redis "
        f"as the broker, and review the deploy of service {f % 7} again on Friday."
    )


def measure(files: int, messages: int) -> dict[str, float]:
    """One round on the package importable here: CPU and wall time per claim and message."""
    from pipeline import runtime, settings, validation

    with tempfile.TemporaryDirectory(prefix="sgme-refine-") as tmp:
        conf = settings.Settings.load(environ={}, data_dir=str(Path(tmp) / "data"))
        rt = runtime.Runtime.open(conf, migrate=True)
        jobs = _Jobs()
        service = rt.service(jobs)
        try:
            for f in range(files):
                roles = ("user", "assistant")
                body = {
                    "agent_id": "bench",
                    "session_key": f"s{f}",
                    "messages": [
                        {"role": roles[i % 2], "content": _text(f, i)} for i in range(messages)
                    ],
                }
                appended = service.append(validation.parse_append(body, conf.limits))
                service.flush(appended.result.file_id)
            started, cpu = time.perf_counter(), time.process_time()
            service.dispatch()
            claims = 0
            while jobs.claims:
                service.refine_segment(jobs.claims.pop(), final=True)
                claims += 1
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            with rt.db.reading() as conn:
                refined = conn.exec_driver_sql("SELECT sum(last_refined_seq) FROM raw_files")
                done = int(refined.scalar() or 0)
        finally:
            rt.close()
    if claims != files or done != files * messages:
        raise SystemExit(f"expected {files} claims of {messages}; got {claims}, {done} refined")
    return {
        "claims/s": claims / wall,
        "cpu ms a claim": cpu / claims * 1e3,
        "cpu us a message": cpu / (claims * messages) * 1e6,
    }


def _run(code: Path, files: int, messages: int) -> dict[str, float]:
    argv = [sys.executable, __file__, "--case", "--code", str(code)]
    argv += ["--files", str(files), "--messages", str(messages)]
    return subrun.case(argv, f"the round on {code}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--messages", type=int, default=20, help="messages a file (a claim)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a tree of the unchanged code")
    parser.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # one round, in this process, on the code in args.code
        sys.path.insert(0, str(args.code))
        print(json.dumps(measure(args.files, args.messages)))
        return 0
    trees = {"sgme": ROOT, **({"unchanged code": args.baseline} if args.baseline else {})}
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, code in trees.items():
            for key, value in _run(code, args.files, args.messages).items():
                mine = best.setdefault(name, {})
                better = max if key == "claims/s" else min
                mine[key] = better(mine.get(key, value), value)
    print(
        f"{args.files} claims of {args.messages} messages, builtin refiner, SQLite, "
        f"best of {args.rounds} rounds"
    )
    print()
    print("| code | claims/s | CPU ms a claim | CPU µs a message |")
    print("|---|---|---|---|")
    for name, found in best.items():
        print(
            f"| {name} | {found['claims/s']:,.0f} | {found['cpu ms a claim']:.2f} | "
            f"{found['cpu us a message']:,.0f} |"
        )
    if "unchanged code" in best:
        ratio = best["unchanged code"]["cpu ms a claim"] / best["sgme"]["cpu ms a claim"]
        print()
        print(f"CPU a claim: the unchanged code's is {ratio:.2f}x this code's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
