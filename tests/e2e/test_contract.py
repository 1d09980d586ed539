"""The HTTP contract, checked by a tool: schemathesis 4 runs against a real ``sgme serve`` with
all its default checks and all its phases (examples, coverage, fuzzing, stateful), from a
fixed seed, for a bounded time. Every schema-valid request must be accepted, every invalid one
refused with a declared 4xx problem document, every answer must match its declared schema,
status and content type, and no request may get a 500. Zero failures.

Auth is on (an admin token for every agent, sent with every request), so the run also checks
that a request without the token is refused as the schema says (schemathesis's
``ignored_auth``).

One answer no schema can foresee is allowed: a schema-valid ``POST /v1/append`` may get a 422
when its session uses sequences and the body has none, or the other way round (issue 13: a
session uses them always or never) — the session's state decides, not the body. And a file
that a ``DELETE /v1/files/{id}`` earlier in the run erased answers every request about it with
410 Gone (the stateful phase erases files it made)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import harness
import httpx
import pytest

SECONDS = "60"  #: the time budget of the run (fuzzing and stateful repeat until it is spent)
SEED = "1"
#: schemathesis.toml of the run (read from its working directory)
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]

[[operations]]
include-path = "/v1/append"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx",
]
"""


@pytest.mark.timeout(240)
def test_schemathesis_finds_nothing(procs: harness.Procs, tmp_path: Path) -> None:
    st = Path(sys.executable).with_name("st")
    if not st.exists() and shutil.which("st") is None:
        pytest.fail("schemathesis is a dev dependency: `make install` installs it")
    port = harness.free_port()
    data = ["--data-dir", str(tmp_path / "data")]
    env = harness.clean_env()
    procs.run(["migrate", *data], env)
    made = procs.run(["token", "create", *data, "--agent-id", "*", "--scope", "admin"], env)
    token = made.strip().splitlines()[-1]
    argv = ["serve", *data, "--port", str(port)]
    server = procs.start("serve", [*argv, "--log-level", "warning"], env)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url) as client:
        harness.wait_healthy(client, server, timeout=60)
    (tmp_path / "schemathesis.toml").write_text(CONFIG, encoding="utf-8")
    done = subprocess.run(
        [
            str(st),
            "run",
            f"{url}/openapi.json",
            "--seed",
            SEED,
            "--header",
            f"Authorization: Bearer {token}",
            "--max-time",
            SECONDS,
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path / "report"),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=tmp_path,
        check=False,
    )
    summary = done.stdout[-6000:]
    assert done.returncode == 0, f"schemathesis found failures:\n{summary}\n{done.stderr[-2000:]}"
    assert "Fuzzing" in done.stdout and "Stateful" in done.stdout, summary
    assert " passed" in done.stdout and "failed" not in done.stdout.lower(), summary
    server.check_alive()
