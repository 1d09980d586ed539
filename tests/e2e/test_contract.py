"""The HTTP contract, checked by a tool: schemathesis 4 runs against a real ``sgme serve`` — on
SQLite and on PostgreSQL — with all its checks and all its phases (examples, coverage,
fuzzing, stateful), with a token (auth on: an admin token for every agent, so a request
without it must be refused as the schema says, schemathesis's ``ignored_auth``). Every
schema-valid request must be accepted, every invalid one refused with a declared 4xx problem
document, every answer must match its declared schema, status and content type, and no
request may get a 500. Zero failures.

The run finds the same thing every time: schemathesis's deterministic generation
(derandomized: no seed, no example database, no variation between runs), one worker, and a fixed
number of examples per operation — not a time budget, which made a slow machine test less
than a fast one. The stateful phase runs first, on the fresh store, in a run of its own: after
the other phases its sequences followed what their appends had left (flushed or not yet,
refined or not yet), and so did a different number of things on every run; alone it sends the
very same requests every time, and the other phases, stateless, nearly so.

One answer of a schema-valid request is allowed besides schemathesis's defaults: 410 Gone.
The stateful phase erases files it made (``DELETE /v1/files/{id}``), and an erased file's id,
which schemathesis keeps using, answers 410 for good; every operation about a file or a ref
declares that answer (checked below)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import harness
import httpx
import pytest

EXAMPLES = "100"  #: test cases per operation and phase
#: schemathesis.toml of the run (read from its working directory): schemathesis's default
#: statuses for a valid request, and the 410 of an erased file
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]
"""


@pytest.mark.timeout(600)
def test_schemathesis_finds_nothing(
    procs: harness.Procs, tmp_path: Path, database_url: str
) -> None:
    st = Path(sys.executable).with_name("st")
    if not st.exists() and shutil.which("st") is None:
        pytest.fail("schemathesis is a dev dependency: `make install` installs it")
    port = harness.free_port()
    data = ["--data-dir", str(tmp_path / "data"), "--database-url", database_url]
    env = harness.clean_env()
    procs.run(["migrate", *data], env)
    made = procs.run(["token", "create", *data, "--agent-id", "*", "--scope", "admin"], env)
    token = made.strip().splitlines()[-1]
    argv = ["serve", *data, "--port", str(port)]
    server = procs.start("serve", [*argv, "--log-level", "warning"], env)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url) as client:
        harness.wait_healthy(client, server, timeout=60)
        schema = client.get("/openapi.json").json()
    for path, operations in schema["paths"].items():
        if "{file_id}" in path or "{ref}" in path:
            for method, operation in operations.items():
                assert "410" in operation["responses"], f"{method.upper()} {path} lacks its 410"
    (tmp_path / "schemathesis.toml").write_text(CONFIG, encoding="utf-8")
    for phases in ("stateful", "examples,coverage,fuzzing"):
        done = subprocess.run(
            [
                str(st),
                "run",
                f"{url}/openapi.json",
                "--phases",
                phases,
                "--checks",
                "all",
                "--generation-deterministic",
                "--workers",
                "1",
                "--max-examples",
                EXAMPLES,
                "--header",
                f"Authorization: Bearer {token}",
                "--no-color",
                "--report",
                "junit",
                "--report-dir",
                str(tmp_path / "report" / phases.replace(",", "-")),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            check=False,
        )
        summary = done.stdout[-6000:]
        assert done.returncode == 0, f"schemathesis found:\n{summary}\n{done.stderr[-2000:]}"
        for phase in phases.split(","):
            assert phase.capitalize() in done.stdout, summary
        assert " passed" in done.stdout and "failed" not in done.stdout.lower(), summary
    server.check_alive()
