"""Run an importer: sessions in, appends out, through an injected ``ingest``.

Each source unit — a Claude Code record, a Codex item, a Hermes or dataset turn — becomes one
append (several when it is larger than one append may be) with a deterministic idempotency key
(:func:`convention.unit_key`, or :func:`convention.key` for a turn keyed by what it says), so
running an import twice writes nothing the second time and an interrupted import, run again,
completes without duplicates. The first append of a session carries its metadata (the server
takes it only from the append that creates the file).

``ingest(body)`` is whatever commits one append: :meth:`Service.append` (after parsing)
in ``sgme import``, ``Client.append`` over HTTP, or a list in tests. It returns the append's
answer; one with ``replayed`` true (or ``{"replayed": True}``) counts as already imported, one
with ``erased`` (the unit was erased from L0, and its key kept so that it stays erased) as
erased.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline import errors
from pipeline.importers import convention, source

Ingest = Callable[[dict[str, Any]], object]
Flush = Callable[[str], object]


@dataclasses.dataclass
class Report:
    """What an import did. ``files`` counts the L0 session files appended to (or found
    complete; not a session whose every unit was refused); ``messages`` the messages newly
    appended; ``replayed`` those an earlier run had already appended; ``erased`` those not
    written because they were erased (the erasure's tombstone holds their keys);
    ``skipped`` the source messages deliberately left out; ``unreadable`` the records that
    could not be read; ``empty`` the records with nothing to import; ``records`` the source
    records read (sessions, empty records and problems); ``errors`` every problem reported
    (the unreadable records and the units the server refused), each with its line."""

    files: int = 0
    messages: int = 0
    replayed: int = 0
    erased: int = 0
    skipped: int = 0
    unreadable: int = 0
    empty: int = 0
    records: int = 0
    errors: list[source.Problem] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` summary: ``{"files", "messages", "replayed", "erased", "skipped",
        "unreadable", "empty", "errors"}``."""
        return {
            "files": self.files,
            "messages": self.messages,
            "replayed": self.replayed,
            "erased": self.erased,
            "skipped": self.skipped,
            "unreadable": self.unreadable,
            "empty": self.empty,
            "errors": [problem.to_json() for problem in self.errors],
        }

    def problem(self, problem: source.Problem) -> None:
        """Report a problem: a record that could not be read, or a unit refused."""
        self.errors.append(problem)
        if not problem.refused:
            self.unreadable += 1


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a run is, after each source record (for a progress display)."""

    file: Path
    files_done: int  #: source files finished
    files_total: int
    report: Report  #: ``report.records`` counts the records read so far


def _no_progress(_event: Progress) -> None:
    return None


def _field(result: object, name: str) -> Any:
    if isinstance(result, Mapping):
        return result.get(name)
    return getattr(result, name, None)


def run(
    reader: source.Reader,
    path: Path,
    *,
    agent_id: str,
    ingest: Ingest,
    flush: Flush | None = None,
    progress: Callable[[Progress], None] = _no_progress,
    dry_run: bool = False,
    max_messages: int = convention.MAX_APPEND_MESSAGES,
    max_bytes: int = convention.MAX_APPEND_BYTES,
) -> Report:
    """Import everything ``reader`` finds under ``path`` as ``agent_id``.

    A malformed record or a unit the server refuses is reported in ``errors`` and skipped;
    the rest goes on. A transient error (the index unreachable) stops the run: nothing
    acknowledged is lost and running it again continues where it stopped. With ``dry_run``
    nothing is sent; the report says what would have been. ``flush(file_id)`` is called once
    per session that got new messages (the CLI writes the file right away).
    """
    report = Report()
    files = reader.files(path)
    for done, file in enumerate(files):
        for item in reader.read(file):
            report.records += 1
            if isinstance(item, source.Problem):
                report.problem(item)
            elif isinstance(item, source.Empty):
                report.empty += 1
            else:
                _session(
                    item,
                    report,
                    agent_id=agent_id,
                    ingest=ingest,
                    flush=flush,
                    dry_run=dry_run,
                    max_messages=max_messages,
                    max_bytes=max_bytes,
                )
            progress(Progress(file=file, files_done=done, files_total=len(files), report=report))
        progress(Progress(file=file, files_done=done + 1, files_total=len(files), report=report))
    return report


def key(session: source.Session, unit: source.Unit, messages: list[convention.Message]) -> str:
    """A unit's idempotency key: its position alone for a source whose units never change,
    else its position and a hash of what it says."""
    if not session.hashed:
        return convention.unit_key(session.source, session.session_key, unit.position)
    return convention.key(
        session.source, session.session_key, unit.position, messages, times=session.times
    )


def bodies(
    session: source.Session,
    *,
    agent_id: str,
    max_messages: int = convention.MAX_APPEND_MESSAGES,
    max_bytes: int = convention.MAX_APPEND_BYTES,
) -> list[tuple[source.Unit, dict[str, Any]]]:
    """The append bodies of a session, each with the unit it comes from, in order."""
    out: list[tuple[source.Unit, dict[str, Any]]] = []
    for unit in session.units:
        messages = [part for m in unit.messages for part in convention.split_large(m)]
        if not messages:
            continue
        unit_key = key(session, unit, messages)
        runs = list(convention.batches(messages, max_messages=max_messages, max_bytes=max_bytes))
        for number, batch in enumerate(runs):
            body: dict[str, Any] = {
                "agent_id": agent_id,
                "session_key": session.session_key,
                "source_type": "session",
                "idempotency_key": unit_key if len(runs) == 1 else f"{unit_key}/{number}",
                "messages": batch,
            }
            if unit.legacy_key is not None:
                body["legacy_key"] = unit.legacy_key
            if not out and session.metadata:
                body["metadata"] = dict(session.metadata)
            out.append((unit, body))
    return out


def _session(
    session: source.Session,
    report: Report,
    *,
    agent_id: str,
    ingest: Ingest,
    flush: Flush | None,
    dry_run: bool,
    max_messages: int,
    max_bytes: int,
) -> None:
    report.skipped += session.skipped
    appends = bodies(session, agent_id=agent_id, max_messages=max_messages, max_bytes=max_bytes)
    if not appends:
        return
    written: set[str] = set()
    landed = False
    for unit, body in appends:
        count = len(body["messages"])
        if dry_run:
            report.messages += count
            landed = True
            continue
        try:
            result = send(ingest, body)
        except errors.Conflict:
            # The key names this unit (its place in the source, or its content hash): the
            # same key with another body differs only in the session metadata (a title set
            # later, say) or in what an earlier version or another path (a capture's spool,
            # redacted before it was kept) wrote for the same unit, and the server keeps the
            # first. The unit is in L0 already.
            report.replayed += count
            landed = True
            continue
        except errors.PermanentError as exc:
            report.problem(
                source.Problem(
                    session.origin,
                    unit.line,
                    f"session {session.session_key!r} unit {unit.position}: {exc.detail}",
                    refused=True,
                )
            )
            continue
        if _field(result, "erased"):
            report.erased += count  # nothing of it is in L0, on purpose
            continue
        landed = True
        if _field(result, "replayed"):
            report.replayed += count
        else:
            report.messages += count
            file_id = _field(result, "file_id")
            if isinstance(file_id, str):
                written.add(file_id)
    report.files += landed
    if flush is not None:
        for file_id in sorted(written):
            flush(file_id)


def send(ingest: Ingest, body: dict[str, Any]) -> object:
    """``ingest(body)``; when the server refuses a body for its metadata, the turn again
    without it — metadata describes a session, the turn is what must not be lost."""
    try:
        return ingest(body)
    except errors.InvalidInput as exc:
        if "metadata" not in body or "metadata" not in exc.detail:
            raise
        return ingest({k: v for k, v in body.items() if k != "metadata"})
