"""``sgme secrets scan``: what the redaction would replace in a text — the place, the kind and
the rule of each secret, a preview with the secret already replaced — from a file or stdin,
storing nothing."""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path

import pytest
import secret_samples

from pipeline import cli

TOKEN = secret_samples.MAKERS["github-token"](random.Random(8))
TEXT = f"GITHUB_TOKEN={TOKEN} and DB_PASSWORD=Zk4rT8wQ1s\nnothing here\nredis://:Rb7nWq2Lx9Tz@r\n"


def _run(capsys: pytest.CaptureFixture[str], *args: str, stdin: str = "") -> tuple[int, str, str]:
    sys.stdin = io.StringIO(stdin)
    try:
        code = cli.main(["secrets", *args])
    finally:
        sys.stdin = sys.__stdin__
    out, err = capsys.readouterr()
    return code, out, err


def test_scan_lists_each_secret_with_its_rule_and_never_prints_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(capsys, "scan", "-", stdin=TEXT)
    assert code == 0 and err == "# 3 secret(s) would be redacted\n"
    preview = "GITHUB_TOKEN=[REDACTED:github-token] and DB_PASSWORD=[REDACTED:password]"
    assert out.splitlines() == [
        f"1:14\tgithub-token\tgitleaks:github-pat\t{preview}",
        f"1:{TEXT.index('Zk4r') + 1}\tpassword\tassignment to DB_PASSWORD\t{preview}",
        "3:10\turl-password\tsgme:url-password\tredis://:[REDACTED:url-password]@r",
    ]
    assert TOKEN not in out and "Zk4rT8wQ1s" not in out


def test_scan_reads_a_file_and_answers_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "notes.md"
    path.write_text(TEXT, encoding="utf-8")
    code, out, _ = _run(capsys, "scan", str(path), "--json")
    rows = json.loads(out)
    assert code == 0 and [r["kind"] for r in rows] == ["github-token", "password", "url-password"]
    first = rows[0]
    assert TEXT[first["start"] : first["end"]] == TOKEN
    assert (first["line"], first["column"], first["length"]) == (1, 14, len(TOKEN))


def test_scan_redacted_prints_the_text_as_it_would_be_stored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _run(capsys, "scan", "-", "--redacted", stdin=TEXT)
    assert code == 0
    assert out == (
        "GITHUB_TOKEN=[REDACTED:github-token] and DB_PASSWORD=[REDACTED:password]\n"
        "nothing here\nredis://:[REDACTED:url-password]@r\n"
    )


def test_scan_without_a_file_or_of_a_missing_one_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = _run(capsys, "scan")
    assert code == cli.EXIT_ERROR and out == "" and "needs a FILE" in err
    code, out, err = _run(capsys, "scan", str(tmp_path / "missing.txt"))
    assert code == cli.EXIT_ERROR and out == "" and "cannot read" in err
