"""One benchmark case in a fresh process: the benchmarks that compare two trees of code run
each round of each tree as ``python SCRIPT --case --code TREE …``, whose last line of output is
its result as a JSON object."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def case(argv: list[str], what: str) -> dict[str, Any]:
    """Run ``argv`` to its end; the JSON object of its last line of output. A case that fails
    ends the benchmark with ``what`` and the case's own error output."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{what} failed:\n{done.stderr}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found
