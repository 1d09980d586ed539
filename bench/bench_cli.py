"""What the command line costs before it does anything: the wall time of ``sgme --help`` and of
a capture hook run that delivers one new turn to a running ``sgme serve``, against a bare
``python -c "import httpx"`` (the least a client that talks HTTP can import), measured in the
same run, the three interleaved so that the machine's load falls on each alike.

    .venv/bin/python bench/bench_cli.py             # 15 runs a case
    .venv/bin/python bench/bench_cli.py --runs 3    # a smoke run
    .venv/bin/python bench/bench_cli.py --check     # exit 1 when a target is missed

The targets (docs/benchmarks.md): ``sgme --help`` at most 2x the bare import, the hook at most
3x. The hook is Claude Code's Stop hook (``sgme capture claude-code``, its JSON on stdin) after
one more turn (a user and an assistant message) was written to a transcript of 10 turns; the
benchmark checks at the end that the server stored every turn, once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_capture import PYTHON, SGME, Transcript, _stored, hook, server

#: the most each case may cost, as a multiple of the bare ``import httpx``
TARGETS = {"sgme --help": 2.0, "capture hook, 1 new turn": 3.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    options = parser.parse_args()
    times: dict[str, list[float]] = {"python -c 'import httpx'": [], **{k: [] for k in TARGETS}}
    with tempfile.TemporaryDirectory() as tmp, server(Path(tmp)) as url:
        root = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("SGME_")}
        base["XDG_CONFIG_HOME"] = str(root / "config")  # no token file but ours (none)
        env = {**base, "SGME_URL": url, "SGME_SPOOL_DIR": str(root / "spool")}
        transcript = Transcript(root / "t.jsonl", "eeeeeeee-0000-4000-8000-000000000005")
        transcript.turn(10)
        hook(env, transcript, "Stop")  # the first reading: the 10 turns before the runs
        for _ in range(options.runs):
            times["python -c 'import httpx'"].append(_timed([str(PYTHON), "-c", "import httpx"]))
            times["sgme --help"].append(_timed([str(SGME), "--help"]))
            transcript.turn()
            times["capture hook, 1 new turn"].append(hook(env, transcript, "Stop"))
        stored = _stored(url, {transcript.session: transcript.n})
        assert stored == {transcript.session: transcript.n}, f"stored {stored}"
    base_time = statistics.median(times["python -c 'import httpx'"])
    missed = []
    print(f"| case ({options.runs} runs, interleaved) | median s | worst s | vs httpx | target |")
    print("|---|---|---|---|---|")
    for name, found in times.items():
        median = statistics.median(found)
        target = TARGETS.get(name)
        ratio = median / base_time
        if target is not None and ratio > target:
            missed.append(name)
        shown = "" if target is None else f"≤ {target:g}x"
        print(f"| {name} | {median:.3f} | {max(found):.3f} | {ratio:.2f}x | {shown} |")
    if options.check and missed:
        raise SystemExit(f"over target: {', '.join(missed)}")


def _timed(argv: list[str]) -> float:
    """The wall time of one run of ``argv``, its output dropped; it must exit 0."""
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


if __name__ == "__main__":
    main()
