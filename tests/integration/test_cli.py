"""The ``sgme`` command (docs/design.md §7) on SQLite and PostgreSQL: append, ls, cat, ref, upload,
fsck, reindex and migrate, with the exit codes and the one-line errors scripts rely on."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import Sgme, assert_one_line_error

from pipeline import catalog, cli, database, document, errors, runtime, tables

TS1 = "2026-08-03T11:18:06Z"
TS2 = "2026-08-03T11:20:05Z"


def append_body(session_key: str = "s1", *messages: dict[str, Any], **extra: Any) -> str:
    return json.dumps(
        {
            "agent_id": "hermes",
            "session_key": session_key,
            "messages": list(messages) or [{"role": "user", "content": "hello", "ts": TS1}],
            **extra,
        }
    )


def raw_path(data_dir: Path, file_id: str, subdir: str = "sessions") -> Path:
    return data_dir / "raw" / subdir / f"{file_id}.md"


def test_append_then_ls_cat_and_ref(sgme: Sgme, data_dir: Path) -> None:
    first = sgme(
        "append",
        stdin=append_body(
            "20260803_191806_5b6c69",
            {"role": "user", "content": "第一条\r\nwith CRLF", "ts": TS1},
            {"role": "tool", "content": "# a comment for the user", "ts": TS2, "tool_name": "sh"},
            metadata={"app": "hermes-desktop"},
        ),
    )
    assert first.code == 0, first.err
    ack = first.json()
    file_id = ack["file_id"]
    assert ack == {
        "file_id": file_id,
        "first_seq": 1,
        "last_seq": 2,
        "source_refs": [f"{file_id}:1", f"{file_id}:2"],
        "status": "new",
        "replayed": False,
        "redacted": 0,
        "erased": 0,
    }
    path = raw_path(data_dir, file_id)
    header = document.Header(
        file_id=file_id,
        session_key="20260803_191806_5b6c69",
        agent_id="hermes",
        source_type="session",
        started_at=TS1,
        metadata={"app": "hermes-desktop"},
    )
    expected = document.render(
        header,
        [
            document.Message("user", "第一条\r\nwith CRLF", TS1),
            document.Message("tool", "# a comment for the user", TS2, tool_name="sh"),
        ],
    ).encode("utf-8")
    assert path.read_bytes() == expected

    second = sgme("append", stdin=append_body("20260803_191806_5b6c69"))
    assert second.code == 0, second.err
    assert (second.json()["file_id"], second.json()["source_refs"]) == (file_id, [f"{file_id}:3"])
    other = sgme("append", stdin=append_body("s2")).json()["file_id"]

    listed = sgme("ls", "--json")
    assert listed.code == 0
    rows = {r["file_id"]: r for r in listed.json()}
    assert set(rows) == {file_id, other}
    assert (rows[file_id]["flushed_seq"], rows[file_id]["status"]) == (3, "new")
    assert rows[file_id]["metadata"] == {"app": "hermes-desktop"}
    assert rows[file_id]["flushed_bytes"] == path.stat().st_size
    assert rows[other]["session_key"] == "s2"
    assert sgme("ls", "--json", "--agent-id", "nobody").json() == []
    # newest first: file_id's last message (TS2) is later than other's (TS1)
    assert [r["file_id"] for r in sgme("ls", "--json", "--limit", "1").json()] == [file_id]
    table = sgme("ls")
    assert table.code == 0 and b"s2" in table.out

    cat = sgme("cat", file_id)
    assert cat.code == 0
    assert cat.out == path.read_bytes()
    assert cat.out.startswith(expected)

    ref = sgme("ref", f"{file_id}:2", "--json")
    assert ref.code == 0, ref.err
    found = ref.json()
    assert found["message"] == {
        "seq": 2,
        "ts": TS2,
        "role": "tool",
        "tool_name": "sh",
        "content": "# a comment for the user",
        "source_ref": f"{file_id}:2",
    }
    assert [m["content"] for m in found["before"]] == ["第一条\r\nwith CRLF"]
    assert [m["seq"] for m in found["after"]] == [3]
    wide = sgme("ref", f"{file_id}:3", "--json", "--context", "5").json()
    assert [m["seq"] for m in wide["before"]] == [1, 2]
    assert wide["after"] == []

    text = sgme("ref", f"{file_id}:2")
    assert text.code == 0
    lines = text.out.decode("utf-8").splitlines()
    assert lines[0] == f"  {file_id}:1 {TS1} user"
    assert f"> {file_id}:2 {TS2} tool (sh)" in lines


def test_upload_stores_a_text_file(sgme: Sgme, data_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "notes.md"
    content = "# Notes\n\n## 2026-08-03T11:18:06Z user\n\n日本語\n"
    source.write_text(content, encoding="utf-8")
    run = sgme("upload", str(source), "--agent-id", "a")
    assert run.code == 0, run.err
    file_id = run.json()["file_id"]
    assert run.json() == {"file_id": file_id, "source_ref": f"{file_id}:1", "redacted": 0}
    path = raw_path(data_dir, file_id, "uploads")
    assert sgme("cat", file_id).out == path.read_bytes()
    ref = sgme("ref", f"{file_id}:1", "--json").json()
    assert ref["message"]["content"] == document.canonical(content)
    [row] = sgme("ls", "--json", "--source-type", "upload").json()
    assert (row["agent_id"], row["metadata"]) == ("a", {"filename": "notes.md"})

    renamed = sgme("upload", str(source), "--agent-id", "a", "--filename", "other.md")
    [row] = [r for r in sgme("ls", "--json").json() if r["file_id"] == renamed.json()["file_id"]]
    assert row["metadata"] == {"filename": "other.md"}


def test_upload_refuses_a_file_that_is_not_utf8(sgme: Sgme, data_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "picture.png"
    source.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    run = sgme("upload", str(source), "--agent-id", "a")
    assert_one_line_error(run, "picture.png", "not UTF-8", "offset 0")
    missing = sgme("upload", str(tmp_path / "nope.txt"), "--agent-id", "a")
    assert_one_line_error(missing, "cannot read", "nope.txt")
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"a\x00b")
    assert_one_line_error(sgme("upload", str(nul), "--agent-id", "a"), "NUL")
    assert sgme("ls", "--json").json() == []
    assert not list(data_dir.glob("raw/*/*.md"))


def test_fsck_is_clean_then_names_the_tampered_file(sgme: Sgme, data_dir: Path) -> None:
    a = sgme("append", stdin=append_body("a")).json()["file_id"]
    b = sgme("append", stdin=append_body("b")).json()["file_id"]
    sgme("append", stdin=append_body("b", {"role": "assistant", "content": "bye", "ts": TS2}))

    clean = sgme("fsck", "--json")
    assert clean.code == 0, clean.err
    assert clean.json() == {"ok": True, "files": []}
    assert sgme("fsck").code == 0

    # Same length, one letter changed: only the hash chain can tell.
    path = raw_path(data_dir, b)
    data = path.read_bytes()
    assert data.count(b"\n\nbye\n\n") == 1
    path.write_bytes(data.replace(b"\n\nbye\n\n", b"\n\nbye\n\n".replace(b"y", b"Y")))

    tampered = sgme("fsck", "--json")
    assert tampered.code == cli.EXIT_PROBLEMS
    report = tampered.json()
    assert report["ok"] is False
    assert [f["file_id"] for f in report["files"]] == [b]
    kinds = [p["kind"] for p in report["files"][0]["problems"]]
    assert kinds == ["chain_mismatch"]
    assert all(p["detail"] for p in report["files"][0]["problems"])

    text = sgme("fsck")
    assert text.code == cli.EXIT_PROBLEMS
    assert f"{b}: chain_mismatch: " in text.out.decode("utf-8")
    assert a not in text.out.decode("utf-8")

    # Bytes past the committed length are reported too.
    with raw_path(data_dir, a).open("ab") as handle:
        handle.write(b"## 2026-08-03T11:30:00Z user\n\nforged\n\n")
    report = sgme("fsck", "--json").json()
    problems = {f["file_id"]: [p["kind"] for p in f["problems"]] for f in report["files"]}
    assert problems == {a: ["uncommitted_tail"], b: ["chain_mismatch"]}


def test_reindex_rebuilds_deleted_rows_from_the_files(
    sgme: Sgme, db: database.Database, tmp_path: Path
) -> None:
    a = sgme(
        "append",
        stdin=append_body(
            "a",
            {"role": "user", "content": "one", "ts": TS1},
            {"role": "tool", "content": "two", "ts": TS2, "tool_name": "t"},
            metadata={"k": "v"},
        ),
    ).json()["file_id"]
    sgme("append", stdin=append_body("b", source_type="external"))
    (tmp_path / "doc.txt").write_text("a document", encoding="utf-8")
    sgme("upload", str(tmp_path / "doc.txt"), "--agent-id", "hermes")
    before = sgme("ls", "--json").json()
    assert len(before) == 3

    with db.transaction() as conn:
        catalog.clear(conn)  # the message catalog goes with the index
        conn.execute(sa.delete(tables.raw_files))
    assert sgme("ls", "--json").json() == []

    run = sgme("reindex", "--json")
    assert run.code == 0, run.err
    assert run.json() == {"scanned": 3, "inserted": 3, "updated": 0, "failed": []}
    after = sgme("ls", "--json").json()
    kept = (
        "file_id",
        "path",
        "source_type",
        "agent_id",
        "session_key",
        "metadata",
        "started_at",
        "ended_at",
        "flushed_seq",
        "flushed_bytes",
        "chain_head",
        "next_seq",
    )
    assert [{k: r[k] for k in kept} for r in after] == [{k: r[k] for k in kept} for r in before]
    assert sgme("fsck", "--json").json() == {"ok": True, "files": []}

    # The rebuilt row carries on where the file ended.
    more = sgme("append", stdin=append_body("a", {"role": "user", "content": "three", "ts": TS2}))
    assert more.json()["file_id"] == a
    assert more.json()["source_refs"] == [f"{a}:3"]

    again = sgme("reindex")
    assert again.code == 0
    assert again.out.decode("utf-8").startswith("reindex: 3 files, 0 inserted, 3 updated, 0 failed")


def test_migrate_creates_and_then_keeps_the_schema(sgme: Sgme, tmp_path: Path) -> None:
    run = sgme("migrate")
    assert run.code == 0, run.err
    assert b"is up to date" in run.out
    assert sgme("migrate").code == 0

    # With no --database-url the index is a SQLite file inside the data directory.
    fresh = tmp_path / "fresh"
    run = sgme("migrate", "--data-dir", str(fresh), common=False)
    assert run.code == 0, run.err
    path = fresh / "index.sqlite3"
    assert path.is_file()
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"raw_files", "append_journal", "append_keys", "anomalies"} <= tables


@pytest.mark.parametrize(
    "command",
    [("ls",), ("fsck",), ("reindex",), ("search", "tea"), ("import", "openai", "CHAT"), ("api",)],
)
def test_commands_other_than_migrate_never_create_a_store(
    sgme: Sgme, tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Run from the wrong directory, a command says where it looked instead of making an
    empty store there (and then saying its schema is behind)."""
    chat = tmp_path / "chat.json"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}]}', encoding="utf-8")
    command = tuple(str(chat) if part == "CHAT" else part for part in command)
    missing = tmp_path / "elsewhere" / "data"
    run = sgme(*command, "--data-dir", str(missing), common=False)
    assert_one_line_error(run, f"no data directory at {missing}", "sgme migrate")
    assert not missing.exists() and not missing.parent.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    run = sgme(*command, "--data-dir", str(empty), common=False)
    assert_one_line_error(run, f"no index at {empty / 'index.sqlite3'}", "sgme migrate")
    assert list(empty.iterdir()) == []  # no empty index.sqlite3 left behind


def test_only_migrate_changes_the_schema(sgme: Sgme, tmp_path: Path) -> None:
    """Reading commands (and every other one but migrate and serve) on a database whose schema
    is behind change nothing and say what to run."""
    from alembic import command
    from alembic.config import Config

    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    db = database.Database.from_url(url)
    config = Config()
    config.set_main_option("script_location", "pipeline:migrations")
    with db.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0002")
    before = database.revisions(db.engine)
    common = ["--data-dir", str(tmp_path / "data"), "--database-url", url]
    for args in (["ls"], ["fsck"], ["cat", "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"], ["reindex"]):
        run = sgme(*args, *common, common=False)
        assert_one_line_error(run, "index schema is at revision 0002", "run `sgme migrate`")
        assert database.revisions(db.engine) == before
    assert before[0] == {"0002"} and before[0] != before[1]
    assert sgme("migrate", *common, common=False).code == 0
    assert database.revisions(db.engine)[0] == before[1]
    assert sgme("ls", *common, "--json", common=False).json() == []
    db.dispose()


BAD = [
    ("not-json", ("append",), "{not json", ("sgme append:", "stdin is not JSON")),
    ("list-body", ("append",), "[1]", ("must be a JSON object",)),
    (
        "unknown-role",
        ("append",),
        append_body("s", {"role": "robot", "content": "x"}),
        ("messages[0].role", "robot"),
    ),
    (
        "bad-ts",
        ("append",),
        append_body("s", {"role": "user", "content": "x", "ts": "soon"}),
        ("messages[0].ts", "soon"),
    ),
    ("control-key", ("append",), append_body("a\x07b"), ("session_key", "control")),
    ("bad-file-id", ("cat", "../../etc/passwd"), None, ("sgme cat:", "not a file_id")),
    (
        "unknown-file",
        ("cat", "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"),
        None,
        ("no file 0b6c3e6e",),
    ),
    ("bad-ref", ("ref", "garbage"), None, ("not a source_ref",)),
    (
        "unknown-ref",
        ("ref", "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60:1"),
        None,
        ("no file",),
    ),
]


@pytest.mark.parametrize(
    ("args", "stdin", "needles"), [pytest.param(a, s, n, id=i) for i, a, s, n in BAD]
)
def test_bad_input_exits_2_with_one_line(
    sgme: Sgme, data_dir: Path, args: tuple[str, ...], stdin: str | None, needles: tuple[str, ...]
) -> None:
    assert_one_line_error(sgme(*args, stdin=stdin), *needles)
    assert sgme("ls", "--json").json() == []
    assert not list(data_dir.glob("raw/*/*.md"))


def test_errors_about_settings_are_one_line_too(sgme: Sgme, data_dir: Path, tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("limits: [\n", encoding="utf-8")
    assert_one_line_error(sgme("ls", "--config", str(bad_yaml)), "not valid YAML")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("colour: blue\n", encoding="utf-8")
    assert_one_line_error(sgme("ls", "--config", str(unknown)), "unknown settings: colour")

    file_id = sgme("append", stdin=append_body("s")).json()["file_id"]
    assert_one_line_error(sgme("ref", f"{file_id}:2"), f"no message {file_id}:2")


@pytest.mark.parametrize(
    "args",
    [("upload", "somefile"), ("ls", "--status", "done"), ("ls", "--source-type", "chat")],
    ids=["missing-agent-id", "unknown-status", "unknown-source-type"],
)
def test_usage_errors_exit_2(sgme: Sgme, args: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sgme(*args)
    assert exit_info.value.code == 2


def test_ls_shows_user_text_as_text_not_markup(sgme: Sgme) -> None:
    keys = ["[/bold]", "[link=https://evil.example]click[/link]", "[red]x"]
    for key in keys:
        assert sgme("append", stdin=append_body(key)).code == 0
    run = sgme("ls")
    assert run.code == 0, run.err
    out = run.out.decode("utf-8")
    for key in keys:
        assert key in out, out
    assert "\x1b" not in out  # no escape sequence (no hyperlink, no colour) from user text
    file_ids = [row["file_id"] for row in sgme("ls", "--json").json()]
    assert all(f in out for f in file_ids)  # whole ids, even in a pipe


def test_the_server_engine_fsyncs_every_commit(tmp_path: Path) -> None:
    """The db `sgme serve` and the workers get commits with SQLite's synchronous=FULL
    (2): with NORMAL a power cut could take back an acknowledged append."""
    from pipeline.cli.context import Context

    args = cli.build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "d")])
    ctx = Context(args)
    try:
        db = ctx.runtime(ctx.settings(), migrate=True).db
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        ctx.close()
    with pytest.raises(errors.Misconfigured, match="power cut"):
        database.create_engine(f"sqlite:///{tmp_path / 'x.db'}", synchronous="NORMAL")
    extra = database.create_engine(f"sqlite:///{tmp_path / 'y.db'}", synchronous="EXTRA")
    with extra.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 3
    extra.dispose()


def test_search_ranks_by_default_all_with_all_and_escapes_control_characters(
    sgme: Sgme,
) -> None:
    sgme(
        "append",
        stdin=append_body(
            "s1",
            {"role": "user", "content": "which colour is the \x1b[2Jmug?", "ts": TS1},
            {"role": "assistant", "content": "Blue.\x07\x1b]0;owned\x07", "ts": TS2},
        ),
    )
    text = sgme("search", "what", "colour", "was", "the", "mugs")
    assert text.code == 0
    assert b"\x1b" not in text.out and b"\x07" not in text.out  # nothing reaches the terminal
    assert b"\\x1b[2Jmug?" in text.out and b"Blue.\\x07\\x1b]0;owned\\x07" in text.out
    ranked = sgme("search", "--json", "what colour was the mugs").json()["hits"]
    assert [h["seq"] for h in ranked] == [1, 2]
    assert ranked[0]["snippet"] == "which colour is the \x1b[2Jmug?"  # JSON keeps the text
    every_word = sgme("search", "--json", "--all", "what colour was the mugs").json()
    lexical = {"mode": "lexical", "model": None, "embedding_lag": None, "fallback": None}
    assert every_word == {"hits": [], "window": None, "ranking": lexical}
    every = sgme("search", "--json", "--all", "which", "colour").json()["hits"]
    assert [h["seq"] for h in every] == [1]


def test_search_takes_a_mode_and_prints_how_it_ranked(
    sgme: Sgme, monkeypatch: pytest.MonkeyPatch
) -> None:
    import helpers

    from pipeline import embeddings

    body = append_body(
        "s1",
        {"role": "user", "content": "the deploy key rotates monthly", "ts": TS1},
        {"role": "assistant", "content": "lunch at noon", "ts": TS2},
    )
    assert sgme("append", stdin=body).code == 0
    unmet = sgme("search", "--mode", "hybrid", "deploy", "key")  # no embedder: by words
    assert unmet.code == 0 and b"the deploy key rotates monthly" in unmet.out
    assert b"ranked by words only: no embedder is configured (setting search_embedder)" in unmet.out
    with pytest.raises(SystemExit) as usage:  # argparse's refusal of a choice it lacks
        sgme("search", "--mode", "fuzzy", "deploy")
    assert usage.value.code == 2
    fake = helpers.FakeEmbedder("fake-cli")
    monkeypatch.setattr(embeddings, "configured", lambda settings: fake)
    monkeypatch.setenv("SGME_SEARCH_EMBEDDER", "local")  # what `sgme embed` checks for
    waiting = sgme("search", "deploy", "key")
    assert b"ranked by words only: no message has a vector of this model yet" in waiting.out
    assert sgme("embed", "--backfill").code == 0
    fused = sgme("search", "--json", "--mode", "hybrid", "deploy", "key").json()
    assert fused["ranking"] == {
        "mode": "hybrid",
        "model": "fake-cli",
        "embedding_lag": 0,
        "fallback": None,
    }
    assert [h["seq"] for h in fused["hits"]][:1] == [1]
    words = sgme("search", "--json", "--mode", "lexical", "deploy", "key").json()
    assert (words["ranking"]["mode"], words["ranking"]["model"]) == ("lexical", "fake-cli")


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(
    sgme: Sgme, data_dir: Path, database_url: str
) -> None:
    """``sgme search … --json | head``: the reader closes the pipe after a few lines; the
    command stops as Unix tools do (128 + SIGPIPE), without a word on stderr."""
    messages = [
        {"role": "user", "content": f"the blue mug number {n} " + "word " * 200, "ts": TS1}
        for n in range(100)
    ]
    assert sgme("append", stdin=append_body("s1", *messages)).code == 0
    argv = [sys.executable, "-m", "pipeline.cli", "search", "blue", "mug", "--json"]
    argv += ["--limit", "100", "--data-dir", str(data_dir), "--database-url", database_url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGME_")}
    # a pipe of one page, so the answer (tens of KB) cannot all fit in it before the reader
    # stops: with the default 64 KiB the command could finish writing first, and exit 0
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)
    with subprocess.Popen(argv, stdout=write_end, stderr=subprocess.PIPE, env=env) as run:
        os.close(write_end)
        assert run.stderr is not None
        with os.fdopen(read_end, "rb") as out:
            assert out.read(10) == b'{\n  "hits"'
        # `head` has what it wanted
        err = run.stderr.read()
        code = run.wait(60)
    assert err == b""
    assert code == 128 + signal.SIGPIPE


@pytest.fixture
def gc_restored() -> Iterator[None]:
    """The collector's thresholds and frozen objects put back after a test that tuned them."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_serve_tunes_the_collector_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gc_restored: None
) -> None:
    """`sgme serve` freezes what it built and collects its youngest generation less often
    (runtime.long_running) by the time uvicorn starts serving."""
    import uvicorn

    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(
        uvicorn.Server,
        "run",
        lambda self: seen.append((gc.get_freeze_count(), gc.get_threshold()[0])),
    )
    gc.set_threshold(700, 10, 10)
    sigterm = signal.getsignal(signal.SIGTERM)  # serve installs its own: not this process'
    try:
        assert cli.main(["serve", "--data-dir", str(tmp_path / "d"), "--port", "8799"]) == 0
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert len(seen) == 1
    frozen, first = seen[0]
    assert first == runtime.GC_THRESHOLD
    assert frozen > 10_000  # the modules, the app, the runtime


def test_long_running_freezes_what_exists_and_raises_the_first_threshold(
    gc_restored: None,
) -> None:
    gc.unfreeze()
    gc.set_threshold(700, 11, 12)
    kept = [object() for _ in range(10)]
    runtime.long_running()
    assert gc.get_threshold() == (runtime.GC_THRESHOLD, 11, 12)
    assert gc.get_freeze_count() >= len(kept)
