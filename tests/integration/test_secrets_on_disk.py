"""Secrets never reach the disk (docs/design.md §13), on SQLite and PostgreSQL: appends over HTTP,
an upload, ``sgme.append`` tasks (one held for its order), and ``sgme import`` carry a secret of
every kind, in messages and metadata; afterwards not one of them is anywhere under the data
directory, in the SQLite files (write-ahead log included), or in a ``pg_dump`` of the index — while
their markers are in the files."""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
import secret_samples
import sqlalchemy as sa
from api_client import Api
from conftest import Sgme

from pipeline import database, flush, ingest, integrity, journal, tables, validation
from pipeline.settings import Settings


def _needles(secret: str) -> list[bytes]:
    """What must not be found: the secret, or (a long one) pieces of it that do not span a
    line break (it may be stored with other line breaks, or JSON-escaped)."""
    found = [secret] if "\n" not in secret else []
    for line in secret.splitlines():
        found += [line[i : i + 24] for i in range(0, max(1, len(line) - 23), 24)]
    return [n.encode() for n in found if len(n) >= 8]


def _planted(seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    return [(kind, *secret_samples.message(kind, rng)) for kind in sorted(secret_samples.MAKERS)]


def _every_byte(root: Path) -> Iterator[tuple[Path, bytes]]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            yield path, path.read_bytes()


def _assert_absent(secrets: list[str], where: Iterator[tuple[str, bytes]]) -> int:
    """Every place, and none holding a piece of a secret; how many bytes were looked at."""
    needles = [(s, n) for s in secrets for n in _needles(s)]
    seen = 0
    for name, data in where:
        seen += len(data)
        for secret, needle in needles:
            assert needle not in data, f"a piece of {secret[:12]}… is in {name}"
    return seen


def test_no_byte_of_a_secret_reaches_the_disk(
    db: database.Database,
    engine: sa.Engine,
    database_url: str,
    data_dir: Path,
    tmp_path: Path,
    sgme: Sgme,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    planted = _planted(20)
    secrets = [secret for _, _, secret in planted]
    api = Api(db, data_dir, database_url, validation.DEFAULT_LIMITS)
    half = len(planted) // 2

    # HTTP: an append (messages and metadata), flushed; an upload
    body = {
        "agent_id": "hermes",
        "session_key": "http",
        "idempotency_key": "http-1",
        "metadata": {"deploy": {"env": f"DB_PASSWORD={secrets[0]}"}},
        "messages": [{"role": "user", "content": text} for _, text, _ in planted[:half]],
    }
    ack = api.append(body, wait=True)
    assert ack["redacted"] >= half + 1
    assert api.append(body, wait=True)["replayed"] is True  # a retry: same answer
    up = api.client.post(
        "/v1/uploads",
        json={"agent_id": "hermes", "filename": "env.txt", "content": planted[half][1]},
    )
    assert up.status_code == 201 and up.json()["redacted"] >= 1, up.text

    # sgme.append tasks: the second one first, held for its order in the index
    service = helpers.service(db, Settings(data_dir=data_dir, database_url=database_url))
    rest = planted[half + 1 :]
    tasks = [
        {
            "agent_id": "celery",
            "session_key": "tasks",
            "idempotency_key": f"t{n}",
            "sequence": n,
            "messages": [{"role": "tool", "tool_name": "shell", "content": text}],
        }
        for n, (_, text, _) in enumerate(rest[:2], start=1)
    ]
    held = service.append_queued(tasks[1])
    assert isinstance(held, ingest.Held) and not held.dropped
    with db.reading() as conn:
        waiting = conn.execute(sa.select(tables.waiting_appends.c.append_json)).scalars().all()
    assert len(waiting) == 1 and "[REDACTED:" in waiting[0]
    done = service.append_queued(tasks[0])
    assert done is not None and not isinstance(done, ingest.Held) and done.redacted == 1

    # sgme import: an OpenAI chat export
    chats = [
        {"id": f"chat-{i}", "messages": [{"role": "user", "content": text, "timestamp": 1}]}
        for i, (_, text, _) in enumerate(rest[2:])
    ]
    export = tmp_path_factory.mktemp("input") / "chats.jsonl"  # not among what is checked
    export.write_text("\n".join(json.dumps(c) for c in chats) + "\n", encoding="utf-8")
    imported = sgme("import", "openai", str(export), "--json")
    assert imported.code == 0, imported.err

    for file_id in flush.stale_files(db, age=0):
        journal.flush(db, data_dir, file_id)
    files = list((data_dir / "raw").rglob("*.md"))
    assert len(files) == 3 + len(chats)
    stored = b"".join(p.read_bytes() for p in files)
    for kind, _, _ in planted:
        if kind not in ("aws-secret-key", "api-key", "token", "secret", "password"):
            assert f"[REDACTED:{kind}]".encode() in stored, kind
    assert integrity.fsck(db, data_dir) == []
    # and one more, left in the journal: the index itself holds its text now
    github = next(text for kind, text, _ in planted if kind == "github-token")
    last = helpers.append(
        service,
        {
            "agent_id": "hermes",
            "session_key": "journal",
            "messages": [{"role": "user", "content": github}],
        },
    )
    assert last.redacted == 1 and flush.stale_files(db, age=0) == [last.result.file_id]

    # every byte under the test's directory: data dir, index file, its -wal and -shm
    seen = _assert_absent(secrets, ((str(p), b) for p, b in _every_byte(tmp_path)))
    assert seen >= len(stored)
    if request.node.callspec.params["database_url"] == "postgres":
        url = database.normalize_url(database_url).replace("postgresql+psycopg", "postgresql")
        dump = subprocess.run(["pg_dump", url], capture_output=True, check=True, timeout=60)
        assert b"[REDACTED:github-token]" in dump.stdout  # the dump holds the index's data
        _assert_absent(secrets, iter([("pg_dump", dump.stdout)]))
    else:
        wal = Path(str(engine.url.database) + "-wal")
        assert wal.exists() and wal.stat().st_size > 0  # the log was looked at, not empty
    api.close()


def test_a_secret_in_a_metadata_key_or_an_idempotency_key_never_reaches_the_disk(
    db: database.Database,
    engine: sa.Engine,
    database_url: str,
    data_dir: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Keys are scanned like values, on each way in: an append over HTTP (and its retry, which
    still replays: its key is scrubbed the same way), an upload, an ``sgme.append`` task; and a
    string under a metadata key that names a secret is one."""
    rng = random.Random(41)
    token = secret_samples.MAKERS["github-token"](rng)
    key_secret = secret_samples.MAKERS["gitlab-token"](rng)
    password = secret_samples.MAKERS["password"](rng)
    secrets = [token, key_secret, password]
    api = Api(db, data_dir, database_url, validation.DEFAULT_LIMITS)
    body = {
        "agent_id": "hermes",
        "session_key": "keys",
        "idempotency_key": f"deploy-{key_secret}",
        "metadata": {token: "the key of this entry is a token", "db_password": password},
        "messages": [{"role": "user", "content": "the metadata says it all"}],
    }
    first = api.append(body, wait=True)
    assert first["redacted"] == 3, first
    again = api.append(body, wait=True)
    assert again["replayed"] is True and again["source_refs"] == first["source_refs"]
    up = api.client.post(
        "/v1/uploads",
        json={
            "agent_id": "hermes",
            "filename": "notes.txt",
            "content": "nothing secret here",
            "idempotency_key": f"upload-{key_secret}",
            "metadata": {f"pw={password}": "x"},
        },
    )
    assert up.status_code == 201 and up.json()["redacted"] == 2, up.text
    service = helpers.service(db, Settings(data_dir=data_dir, database_url=database_url))
    task = {
        "agent_id": "celery",
        "session_key": "keys",
        "idempotency_key": f"task-{token}",
        "metadata": {"GITHUB_TOKEN": token},
        "messages": [{"role": "tool", "tool_name": "shell", "content": "ok"}],
    }
    done = service.append_queued(task)
    assert done is not None and not isinstance(done, ingest.Held) and done.redacted == 2
    for file_id in flush.stale_files(db, age=0):
        journal.flush(db, data_dir, file_id)

    with db.reading() as conn:
        keys = sorted(conn.execute(sa.select(tables.append_keys.c.idempotency_key)).scalars())
    assert keys == [
        "deploy-[REDACTED:gitlab-token]",
        "task-[REDACTED:github-token]",
        "upload-[REDACTED:gitlab-token]",
    ]
    stored = b"".join(p.read_bytes() for p in (data_dir / "raw").rglob("*.md"))
    assert b'"[REDACTED:github-token]": "the key of this entry is a token"' in stored
    assert b'"db_password": "[REDACTED:password]"' in stored
    _assert_absent(secrets, ((str(p), b) for p, b in _every_byte(tmp_path)))
    if request.node.callspec.params["database_url"] == "postgres":
        url = database.normalize_url(database_url).replace("postgresql+psycopg", "postgresql")
        dump = subprocess.run(["pg_dump", url], capture_output=True, check=True, timeout=60)
        assert b"deploy-[REDACTED:gitlab-token]" in dump.stdout
        _assert_absent(secrets, iter([("pg_dump", dump.stdout)]))
    api.close()
