"""The append protocol (DESIGN §3): ingest into the journal, then flush to the file.

Ingest is the acknowledgement point: one transaction allocates seqs, renders the blocks and
stores them as one ``append_journal`` row. The file is written later by :func:`flush`, under
a per-file lock, from the journal alone, so a lost queue message, a crashed worker or a wiped
broker can delay a write but never lose or repeat one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pipeline import archive, document, errors, index, metrics, store

#: a fault-injection hook: called with a step name at each step of a flush (tests use it)
FaultHook = Callable[[str], None]
FLUSH_STEPS = ("locked", "read", "truncated", "written", "committed")
APPEND_FIELDS = {
    "agent_id",
    "session_key",
    "source_type",
    "metadata",
    "idempotency_key",
    "messages",
}
UPLOAD_FIELDS = {"agent_id", "filename", "content", "metadata", "idempotency_key"}
MAX_IDEMPOTENCY_KEY = 200


@dataclasses.dataclass(frozen=True)
class AppendResult:
    """What an append is answered with; ``kick`` says whether a flush must be enqueued."""

    file_id: str
    first_seq: int
    last_seq: int
    source_refs: tuple[str, ...]
    status: str
    kick: bool = False
    replayed: bool = False

    def to_json(self) -> dict[str, Any]:
        """The API's response body."""
        return {
            "file_id": self.file_id,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "source_refs": list(self.source_refs),
            "status": self.status,
        }


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What one flush wrote."""

    file_id: str
    messages: int
    bytes: int
    flushed_seq: int


def request_hash(body: Mapping[str, Any]) -> str:
    """A digest of a request body, to tell a retry from a different request with the same key."""
    encoded = json.dumps(body, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def _check_fields(body: object, allowed: set[str], what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise errors.InvalidInput(f"{what} body must be a JSON object")
    unknown = set(body) - allowed
    if unknown:
        raise errors.InvalidInput(f"{what} body has unknown fields: {', '.join(sorted(unknown))}")
    return body


def _check_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_IDEMPOTENCY_KEY:
        raise errors.InvalidInput(
            f"idempotency_key must be a string of 1..{MAX_IDEMPOTENCY_KEY} characters"
        )
    document.check_text(value, "idempotency_key")
    return value


def _check_messages(
    raw: object, limits: document.Limits, received_at: Any
) -> list[document.Message]:
    if not isinstance(raw, list) or not raw:
        raise errors.InvalidInput("messages must be a non-empty list")
    if len(raw) > limits.max_append_messages:
        raise errors.InvalidInput(
            f"an append holds at most {limits.max_append_messages} messages; got {len(raw)}"
        )
    messages = [
        document.make_message(item, index=i, received_at=received_at, limits=limits)
        for i, item in enumerate(raw)
    ]
    total = sum(len(m.content.encode("utf-8")) for m in messages)
    if total > limits.max_append_bytes:
        raise errors.InvalidInput(
            f"an append holds at most {limits.max_append_bytes} bytes of content; got {total}"
        )
    return messages


def _replay(
    conn: sa.Connection, agent_id: str, key: str | None, digest: str
) -> AppendResult | None:
    """The recorded answer for a retried idempotency key, or None when the key is new."""
    if key is None:
        return None
    found = index.get_key(conn, agent_id, key)
    if found is None:
        return None
    recorded_hash, response = found
    if recorded_hash != digest:
        raise errors.Conflict(f"idempotency_key {key!r} was already used with a different body")
    response["source_refs"] = tuple(response["source_refs"])
    return AppendResult(**response, replayed=True)


def ingest(
    engine: sa.Engine,
    body: Mapping[str, Any],
    *,
    limits: document.Limits = document.DEFAULT_LIMITS,
    source_types: Sequence[str] = ("session", "external"),
) -> AppendResult:
    """Validate an append and commit it to the journal (the acknowledgement point).

    Nothing is written when anything in the body is wrong. The caller enqueues a flush when
    ``result.kick`` is true (no flush was already pending for the file).
    """
    body = _check_fields(body, APPEND_FIELDS, "append")
    agent_id = document.check_agent_id(body.get("agent_id"))
    session_key = document.check_session_key(body.get("session_key"), limits)
    source_type = document.check_source_type(body.get("source_type", "session"), source_types)
    metadata = document.check_metadata(body.get("metadata"), limits)
    key = _check_key(body.get("idempotency_key"))
    received_at = index.utcnow()
    messages = _check_messages(body.get("messages"), limits, received_at)
    digest = request_hash(body) if key is not None else ""  # only keyed requests replay

    with index.transaction(engine) as conn:
        row = index.find_file(conn, agent_id, source_type, session_key, for_update=True)
        if row is None:
            file_id = str(uuid.uuid4())
            index.insert_file(
                conn,
                file_id=file_id,
                path=store.relative_path(source_type, file_id),
                source_type=source_type,
                agent_id=agent_id,
                session_key=session_key,
                metadata_json=json.dumps(metadata, ensure_ascii=False),
                started_at=document.parse_ts(messages[0].ts).replace(tzinfo=None),
                status="pending",
            )
            # On PostgreSQL a concurrent creator may have won; either way lock the row now.
            row = index.find_file(conn, agent_id, source_type, session_key, for_update=True)
            assert row is not None
        # Checked under the row lock, so two retries of one request cannot both pass.
        replayed = _replay(conn, agent_id, key, digest)
        if replayed is not None:
            return replayed
        first = row.next_seq
        rendered = "".join(
            document.render_block(m, first=first + i == 1) for i, m in enumerate(messages)
        )
        if first == 1:
            rendered = document.render_frontmatter(_header(row)) + rendered
        last = first + len(messages) - 1
        index.add_journal(
            conn,
            file_id=row.file_id,
            first_seq=first,
            last_seq=last,
            last_ts=max((m.ts for m in messages), key=document.parse_ts),
            data=rendered,
        )
        index.update_file(conn, row.file_id, next_seq=last + 1, flush_pending=True)
        result = AppendResult(
            file_id=row.file_id,
            first_seq=first,
            last_seq=last,
            source_refs=tuple(f"{row.file_id}:{seq}" for seq in range(first, last + 1)),
            status=row.status,
            kick=not row.flush_pending,
        )
        if key is not None:
            response = result.to_json()
            response["source_refs"] = list(result.source_refs)
            index.put_key(conn, agent_id, key, digest, response)
        return result


def _header(row: index.FileRow) -> document.Header:
    return document.Header(
        file_id=row.file_id,
        session_key=row.session_key,
        agent_id=row.agent_id,
        source_type=row.source_type,
        started_at=document.format_ts(row.started_at),
        metadata=row.metadata,
    )


def ingest_upload(
    engine: sa.Engine,
    body: Mapping[str, Any],
    *,
    limits: document.Limits = document.DEFAULT_LIMITS,
) -> AppendResult:
    """Commit an uploaded text document as a new file of one message (DESIGN §2.7)."""
    body = _check_fields(body, UPLOAD_FIELDS, "upload")
    agent_id = document.check_agent_id(body.get("agent_id"))
    filename = body.get("filename")
    if not isinstance(filename, str) or not 1 <= len(filename) <= 255:
        raise errors.InvalidInput("filename must be a string of 1..255 characters")
    try:
        document.check_session_key(filename, limits)  # same rules: no control characters
    except errors.InvalidInput as exc:
        # The detail must name the field the client sent, not the rule borrowed for it.
        raise errors.InvalidInput(exc.detail.replace("session_key", "filename", 1)) from None
    content = body.get("content")
    if not isinstance(content, str):
        raise errors.InvalidInput("content must be a string (uploads are UTF-8 text)")
    size = len(document.check_text(content, "content"))
    if size > limits.max_append_bytes:
        raise errors.InvalidInput(
            f"an upload holds at most {limits.max_append_bytes} bytes; got {size}"
        )
    metadata = {**document.check_metadata(body.get("metadata"), limits), "filename": filename}
    document.check_metadata(metadata, limits)
    key = _check_key(body.get("idempotency_key"))
    digest = request_hash(body)
    try:
        return _commit_upload(engine, agent_id, key, digest, metadata, content)
    except index.ConstraintViolation:
        if key is None:
            raise
        # A concurrent retry with the same key won the race: answer as it did.
        return _commit_upload(engine, agent_id, key, digest, metadata, content)


def _commit_upload(
    engine: sa.Engine,
    agent_id: str,
    key: str | None,
    digest: str,
    metadata: dict[str, Any],
    content: str,
) -> AppendResult:
    now = index.utcnow()
    file_id = str(uuid.uuid4())
    with index.transaction(engine) as conn:
        replayed = _replay(conn, agent_id, key, digest)
        if replayed is not None:
            return replayed
        index.insert_file(
            conn,
            file_id=file_id,
            path=store.relative_path("upload", file_id),
            source_type="upload",
            agent_id=agent_id,
            session_key=file_id,
            metadata_json=json.dumps(metadata, ensure_ascii=False),
            started_at=now,
            status="pending",
            next_seq=2,
            flush_pending=True,
        )
        row = index.get_file(conn, file_id)
        assert row is not None
        rendered = document.render_frontmatter(_header(row)) + document.render_upload(content)
        index.add_journal(
            conn,
            file_id=file_id,
            first_seq=1,
            last_seq=1,
            last_ts=document.format_ts(now),
            data=rendered,
        )
        result = AppendResult(
            file_id=file_id,
            first_seq=1,
            last_seq=1,
            source_refs=(f"{file_id}:1",),
            status="pending",
            kick=True,
        )
        if key is not None:
            response = result.to_json()
            index.put_key(conn, agent_id, key, digest, response)
        return result


# ---------------------------------------------------------------------------------------------
# flush


def _damaged(
    engine: sa.Engine, file_id: str, kind: str, detail: str, *, mark_error: bool = True
) -> errors.FileDamaged:
    """Record that a file cannot be flushed. The sweeper keeps re-kicking it (its journal rows
    wait), so the anomaly is written once per kind, not on every attempt."""
    with index.transaction(engine) as conn:
        if mark_error:
            index.update_file(conn, file_id, status="error")
        if not index.list_anomalies(conn, file_id=file_id, kinds=[kind]):
            index.record_anomaly(conn, file_id, kind, detail)
    return errors.FileDamaged(f"file {file_id}: {detail}")


def _no_fault(step: str) -> None:
    return None


def flush(
    engine: sa.Engine,
    data_dir: Path,
    file_id: str,
    *,
    lock_timeout: float = 30.0,
    fault: FaultHook = _no_fault,
) -> FlushResult:
    """Write every journal row of ``file_id`` past ``flushed_seq`` to its file, once.

    Idempotent: running it twice, concurrently or after a crash at any point, leaves each
    acknowledged message in the file exactly once and in seq order.
    """
    with store.lock(data_dir, file_id, timeout=lock_timeout), index.advisory_lock(engine, file_id):
        fault("locked")
        started = time.perf_counter()
        with index.transaction(engine) as conn:
            # Cleared before reading, so an append committed after this read kicks again.
            row = index.start_flush(conn, file_id)
            pending = index.journal_after(conn, file_id, row.flushed_seq) if row else []
        if row is None:
            raise errors.NotFound(f"no file {file_id}")
        if not pending:
            return FlushResult(file_id, 0, 0, row.flushed_seq)
        fault("read")
        seq = row.flushed_seq
        for entry in pending:
            if entry.first_seq != seq + 1:
                raise _damaged(
                    engine,
                    file_id,
                    "journal_gap",
                    f"journal resumes at seq {entry.first_seq}, file ends at seq {seq}",
                )
            seq = entry.last_seq

        if row.status == "archived":
            # An append to an archived session brings the file back first (DESIGN §5).
            try:
                row = archive.restore_locked(engine, data_dir, row)
            except errors.FileDamaged as exc:
                # Stay archived (reads keep decompressing); the appends wait in the journal.
                raise _damaged(
                    engine, file_id, "restore_failed", exc.detail, mark_error=False
                ) from None

        path = data_dir / row.path
        expected = row.flushed_bytes
        current = store.size(path)
        if current is None and expected > 0:
            raise _damaged(engine, file_id, "file_missing", f"{row.path} is missing")
        if current is not None and current < expected:
            raise _damaged(
                engine,
                file_id,
                "file_shrunk",
                f"{row.path} is {current} bytes but {expected} were committed; not writing "
                "past a hole",
            )
        if current is not None and current > expected:
            # The journal proves these bytes were never acknowledged: a flush died mid-write.
            store.truncate(path, expected)
            with index.transaction(engine) as conn:
                index.record_anomaly(
                    conn,
                    file_id,
                    "torn_tail_truncated",
                    f"cut {current - expected} unacknowledged bytes after offset {expected}",
                )
            fault("truncated")

        data = "".join(entry.data for entry in pending).encode("utf-8")
        if expected == 0:
            head, _ = document.chain(data)
        else:
            head = bytes.fromhex(row.chain_head or "")
            for block in document.split_rendered(data):
                head = document.chain_extend(head, block)

        if current is None:
            store.create(path, data)
        else:
            store.append(path, data, expected_size=expected)
            if expected == 0:
                store.fsync_dir(path.parent)
        fault("written")

        with index.transaction(engine) as conn:
            updated = index.advance_flushed(
                conn,
                file_id,
                old_seq=row.flushed_seq,
                flushed_seq=seq,
                flushed_bytes=expected + len(data),
                chain_head=head.hex(),
                ended_at=max(document.parse_ts(e.last_ts) for e in pending).replace(tzinfo=None),
            )
            if not updated:
                raise errors.Conflict(f"file {file_id} was flushed by someone else meanwhile")
            index.delete_journal(conn, file_id, seq)
        fault("committed")
        metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)
        now = index.utcnow()
        for entry in pending:
            metrics.ACK_TO_FLUSH_SECONDS.observe((now - entry.created_at).total_seconds())
        return FlushResult(file_id, seq - row.flushed_seq, len(data), seq)


def stale_files(engine: sa.Engine, *, age: float) -> list[str]:
    """Files whose journal rows have waited more than ``age`` seconds (the sweeper's list)."""
    import datetime as dt

    with index.transaction(engine) as conn:
        return index.stale_journal_files(conn, index.utcnow() - dt.timedelta(seconds=age))
