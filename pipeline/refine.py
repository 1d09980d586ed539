"""Incremental refinement (docs/design.md §4): due files, the claim, segments, windows, refiners and
the fenced commit that feeds L1 exactly once.

A file is *due* when it has flushed messages past ``last_refined_seq`` and either enough of
them wait or the session has been quiet long enough. Claiming bumps ``refine_epoch`` and sets a
lease; the job for segment ``lo < seq <= hi`` then commits its L1 items together with
``last_refined_seq = hi`` only if the epoch and ``lo`` are still what it claimed, so a stale,
duplicated or redelivered job commits nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import math
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from pipeline import anomalies, database, document, errors, index, l1, leases, reader, refs, tables
from pipeline.tables import Kind, Status

if TYPE_CHECKING:
    from pipeline.settings import Settings

log = logging.getLogger(__name__)
REFINER_GROUP = "sgme.refiners"


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claimed segment: messages ``lo < seq <= hi`` of a file, fenced by ``epoch``."""

    file_id: str
    lo: int
    hi: int
    epoch: int


@dataclasses.dataclass(frozen=True)
class Window:
    """What a refiner is fed: a stretch of the segment rendered in the L0 format itself.

    ``parts`` are the window's messages; a message too large for one window is cut into parts
    that keep its seq (and so its source_ref).
    """

    file_id: str
    agent_id: str
    session_key: str
    text: str
    parts: tuple[document.Message, ...]

    def source_ref(self, part: document.Message) -> str:
        """The source_ref of one of the window's parts."""
        return refs.format(self.file_id, part.seq)

    @property
    def source_refs(self) -> tuple[str, ...]:
        """The distinct source_refs of the window, in order."""
        return tuple(dict.fromkeys(self.source_ref(p) for p in self.parts))

    def to_json(self) -> dict[str, Any]:
        """The window as the webhook refiner sends it."""
        return {
            "file_id": self.file_id,
            "agent_id": self.agent_id,
            "session_key": self.session_key,
            "text": self.text,
            "source_refs": list(self.source_refs),
            "messages": [p.to_json(self.file_id) for p in self.parts],
        }


@dataclasses.dataclass(frozen=True)
class Item:
    """One L1 item a refiner produced, with the raw messages it stands on."""

    kind: str
    content: str
    source_refs: tuple[str, ...]

    def digest(self) -> str:
        """Identity of the item, for idempotent storage."""
        encoded = json.dumps([self.kind, self.content, sorted(self.source_refs)])
        return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


class Refiner(Protocol):
    """Turns a window into L1 items. Raise :class:`errors.RefinerError` for a retryable
    failure (anything else a refiner raises is treated the same way).

    A refiner whose work is Python in this process (no waiting on a model or a service) may
    say ``parallel = False``: its jobs then take turns, one at a time in a process
    (:meth:`Refiners.turn`), instead of contending for the interpreter and the write lock."""

    name: str

    def refine(self, window: Window) -> list[Item]:
        """Items found in ``window``; every item's source_refs must be the window's."""
        ...


def load_refiner(name: str, options: Mapping[str, Any] | None = None) -> Refiner:
    """The refiner registered as ``name`` in the ``sgme.refiners`` entry point group, or
    ``package.module:Class`` for one that is not registered."""
    if ":" in name:
        entry = importlib_metadata.EntryPoint(name=name, value=name, group=REFINER_GROUP)
    else:
        found = importlib_metadata.entry_points(group=REFINER_GROUP, name=name)
        if not found:
            known = sorted(ep.name for ep in importlib_metadata.entry_points(group=REFINER_GROUP))
            raise errors.InvalidInput(f"unknown refiner {name!r}; installed: {', '.join(known)}")
        entry = next(iter(found))
    try:
        factory = entry.load()
    except (ImportError, AttributeError) as exc:
        raise errors.InvalidInput(f"cannot load refiner {name!r}: {exc}") from None
    try:
        refiner: Refiner = factory(**dict(options or {}))
    except TypeError as exc:
        raise errors.InvalidInput(f"bad options for refiner {name!r}: {exc}") from None
    return refiner


class Refiners:
    """The configured refiner, loaded on first use (its plug-in may be slow to import, or
    missing) and then shared by everything that refines in the process, with the turns its
    jobs take (``jobs_at_once``: the ``refine_jobs_at_once`` setting; 0 leaves it to the
    refiner, :class:`Refiner`)."""

    def __init__(
        self, name: str, options: Mapping[str, Any] | None = None, *, jobs_at_once: int = 0
    ) -> None:
        self.name = name
        self.options = dict(options or {})
        self.jobs_at_once = jobs_at_once
        self._loaded: Refiner | None = None
        #: the jobs' turns, sized when the refiner is loaded (None: no limit)
        self._turns: threading.BoundedSemaphore | None = None
        self._lock = threading.Lock()

    @classmethod
    def configured(cls, settings: Settings) -> Refiners:
        """The holder of the refiner ``settings`` name."""
        return cls(
            settings.refiner, settings.refiner_options, jobs_at_once=settings.refine.jobs_at_once
        )

    @classmethod
    def given(cls, refiner: Refiner, *, jobs_at_once: int = 0) -> Refiners:
        """A holder of a refiner made elsewhere (a program that embeds the library, a test)."""
        found = cls(refiner.name, jobs_at_once=jobs_at_once)
        found._loaded = refiner
        found._turns = found._sized(refiner)
        return found

    def get(self) -> Refiner:
        """The refiner, loaded once."""
        with self._lock:
            if self._loaded is None:
                refiner = load_refiner(self.name, self.options)
                self._turns = self._sized(refiner)
                self._loaded = refiner
            return self._loaded

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """One of the jobs' turns, held while the block runs: at most ``jobs_at_once`` jobs of
        this process at a time, or one for a refiner that is not ``parallel``; no limit
        before the refiner is loaded (a process' first jobs, one of which loads it). The
        builtin refiner's jobs in parallel only took turns at the interpreter and at SQLite's
        write lock: one at a time, ``sgme serve`` made about a tenth more appends a second
        under load (the thirteenth throughput pass in the history of docs/benchmarks.md)."""
        turns = self._turns
        if turns is None:
            yield
            return
        with turns:
            yield

    def _sized(self, refiner: Refiner) -> threading.BoundedSemaphore | None:
        limit = self.jobs_at_once or (0 if getattr(refiner, "parallel", True) else 1)
        return threading.BoundedSemaphore(limit) if limit else None


# ---------------------------------------------------------------------------------------------
# windows


def estimate_tokens(text: str) -> int:
    """A model-free token estimate: about four bytes of UTF-8 per token."""
    return math.ceil(len(text.encode("utf-8")) / 4)


def _split_content(content: str, budget_bytes: int) -> list[str]:
    """Cut content into pieces of at most ``budget_bytes`` of UTF-8, at line breaks where
    possible and never inside a character."""
    data = content.encode("utf-8")
    pieces: list[str] = []
    start = 0
    while len(data) - start > budget_bytes:
        end = start + budget_bytes
        cut = data.rfind(b"\n", start, end)
        if cut - start <= budget_bytes // 2:
            cut = end
            while data[cut] & 0xC0 == 0x80:  # a continuation byte: back up to the character
                cut -= 1
        pieces.append(data[start:cut].decode("utf-8"))
        start = cut
        while data.startswith(b"\n", start):
            start += 1
    pieces.append(data[start:].decode("utf-8"))
    return pieces


def _render_part(part: document.Message) -> str:
    return document.render_block(part, first=part.seq == 1)


def windows(
    file: tables.FileRow,
    messages: Sequence[document.Message],
    *,
    budget_tokens: int,
    overlap: int = 1,
) -> list[Window]:
    """Pack the segment's messages into windows of at most ``budget_tokens`` each.

    Each window after the first repeats the last ``overlap`` messages of the one before, for
    context. A message larger than a window is split into parts that keep its source_ref.
    """
    budget_tokens = max(budget_tokens, 64)
    parts: list[document.Message] = []
    for whole in messages:
        if _cost(whole) <= budget_tokens:
            parts.append(whole)
            continue
        # Measured in bytes, as estimate_tokens is (a 4-byte character is a token on its own):
        # the body gets what the heading and tool line leave of budget_tokens * 4 bytes, less
        # what escaping may add, one backslash per line, at most one byte in nine (the
        # shortest escaped line is "#  user\n"). Otherwise a part overflows its window.
        head = len(_render_part(dataclasses.replace(whole, content="")).encode("utf-8")) + 2
        budget_bytes = max(16, (8 * (budget_tokens * 4 - head) - 1) // 9)
        for piece in _split_content(whole.content, budget_bytes):
            parts.append(dataclasses.replace(whole, content=piece))

    result: list[Window] = []
    current: list[document.Message] = []
    used = 0
    for part in parts:
        cost = _cost(part)
        if current and used + cost > budget_tokens:
            result.append(_window(file, current))
            carried = [p for p in current[-overlap:] if overlap > 0 and p.seq != part.seq]
            carried_cost = sum(_cost(p) for p in carried)
            current, used = (
                (carried, carried_cost) if carried_cost + cost <= budget_tokens else ([], 0)
            )
        current.append(part)
        used += cost
    if current:
        result.append(_window(file, current))
    return result


def _cost(part: document.Message) -> int:
    return estimate_tokens(_render_part(part))


def _window(file: tables.FileRow, parts: list[document.Message]) -> Window:
    return Window(
        file_id=file.file_id,
        agent_id=file.agent_id,
        session_key=file.session_key,
        text="".join(_render_part(p) for p in parts),
        parts=tuple(parts),
    )


# ---------------------------------------------------------------------------------------------
# due files, claim, run, commit


def due_files(
    db: database.Database,
    *,
    min_messages: int,
    idle_seconds: float,
    limit: int = 100,
    file_ids: Sequence[str] | None = None,
) -> list[str]:
    """Files with unrefined flushed messages that are due and not leased, from a read
    snapshot (no write lock: the flush rounds ask after every round; each file is claimed in a
    write transaction of its own, which checks it again)."""
    with db.reading() as conn:
        return index.due_files(
            conn,
            min_messages=min_messages,
            idle_seconds=idle_seconds,
            limit=limit,
            file_ids=file_ids,
            now=db.now(),
        )


def claim(db: database.Database, file_id: str, *, lease_seconds: float) -> Claim | None:
    """Reserve the file's unrefined segment for one job, or None if it is leased or done."""
    now = db.now()
    found = db.commit(
        lambda conn: index.claim_segment(conn, file_id, lease_seconds=lease_seconds, now=now),
        key=file_id,
    )
    return Claim(file_id, *found) if found else None


def dispatch(
    db: database.Database,
    *,
    min_messages: int,
    idle_seconds: float,
    lease_seconds: float,
    file_ids: Sequence[str] | None = None,
    limit: int = 100,
) -> list[Claim]:
    """Claim every due file (up to ``limit``); each claim becomes one refine_segment job."""
    claims = []
    for file_id in due_files(
        db,
        min_messages=min_messages,
        idle_seconds=idle_seconds,
        limit=limit,
        file_ids=file_ids,
    ):
        found = claim(db, file_id, lease_seconds=lease_seconds)
        if found is not None:
            claims.append(found)
    return claims


def segment(
    db: database.Database, data_dir: Path, c: Claim
) -> tuple[tables.FileRow, list[document.Message]]:
    """The file row and the messages ``lo < seq <= hi`` of a claim, read from the file."""
    row = reader.get_file(db, c.file_id)
    found = reader.between(db, data_dir, row, c.lo, c.hi)
    if len(found) != c.hi - c.lo:
        raise errors.FileDamaged(
            f"file {c.file_id} has {len(found)} of the messages {c.lo}<seq<={c.hi} claimed"
        )
    return row, found


def check_items(window: Window, items: Sequence[Item]) -> list[Item]:
    """Keep items with content and with source_refs from the window (others are dropped)."""
    allowed = set(window.source_refs)
    kept = []
    for item in items:
        refs = tuple(r for r in dict.fromkeys(item.source_refs) if r in allowed)
        if item.content.strip() and refs:
            kept.append(Item(item.kind[:40] or "fact", item.content, refs))
    return kept


def run(
    db: database.Database,
    data_dir: Path,
    refiner: Refiner,
    c: Claim,
    *,
    budget_tokens: int,
    overlap: int,
) -> list[Item]:
    """Feed the claimed segment, window by window, to ``refiner``; the items it returns.

    Whatever a refiner raises that is not one of ours counts as a :class:`errors.RefinerError`
    (retried): a plug-in's bug or its client library's exception must not lose the claim.
    """
    row, found = segment(db, data_dir, c)
    items: list[Item] = []
    for window in windows(row, found, budget_tokens=budget_tokens, overlap=overlap):
        try:
            answer = refiner.refine(window)
        except errors.SgmeError:
            raise
        except Exception as exc:
            raise errors.RefinerError(f"refiner {refiner.name!r} raised {exc!r}") from exc
        items.extend(check_items(window, answer))
    return items


@contextlib.contextmanager
def heartbeat(db: database.Database, c: Claim, *, lease_seconds: float) -> Iterator[None]:
    """Renew the claim's lease every third of ``lease_seconds`` while the block runs, so a
    slow refiner keeps its claim while a lost job frees its file within one lease (one thread
    renews every running job's: :mod:`pipeline.leases`)."""
    with leases.KEEPER.holding(db, c.file_id, epoch=c.epoch, lease_seconds=lease_seconds):
        yield


def commit(db: database.Database, c: Claim, items: Sequence[Item], *, refiner: str) -> bool:
    """Store the items and advance ``last_refined_seq`` — only if the claim still holds.

    False for a stale or duplicate job: nothing is stored.
    """
    now = db.now()
    # made before the transaction: the write lock is not held while items are encoded
    rows = [
        {
            "file_id": c.file_id,
            "kind": item.kind,
            "content": item.content,
            "source_refs": json.dumps(list(item.source_refs)),
            "refiner": refiner,
            "segment_lo": c.lo,
            "segment_hi": c.hi,
            "item_hash": item.digest(),
        }
        for item in items
    ]

    def work(conn: sa.Connection) -> bool:
        row = index.get_file(conn, c.file_id)
        if row is None or not index.commit_segment(
            conn, c.file_id, epoch=c.epoch, lo=c.lo, hi=c.hi, now=now
        ):
            return False
        if c.lo == 0:
            # A full (re-)refine replaces whatever the file's items were.
            l1.delete_items(conn, c.file_id)
            _finish_full(conn, c.file_id, now)
        l1.add_items(conn, [{**r, "agent_id": row.agent_id} for r in rows], now=now)
        return True

    return db.commit(work, key=c.file_id)


def fail(db: database.Database, c: Claim, detail: str) -> bool:
    """After the last retry: mark the file ``error`` with a ``refine_failed`` anomaly."""
    now = db.now()
    with db.transaction() as conn:
        if not index.fail_segment(conn, c.file_id, epoch=c.epoch, now=now):
            return False
        detail = f"segment {c.lo}<seq<={c.hi}: {detail}"
        anomalies.record(conn, c.file_id, Kind.REFINE_FAILED, detail, now=now)
        return True


def request_full(
    db: database.Database,
    file_id: str,
    *,
    cooldown: float = 0.0,
    agents: Collection[str] | None = None,
) -> None:
    """Full re-refine: ``last_refined_seq = 0``; the file's L1 items are replaced when the run
    commits (until then the old ones stay listed).

    ``agents``: the file must belong to one of them, or it is NotFound exactly as a file that
    does not exist. ``cooldown`` (seconds; the API passes ``refine_cooldown_seconds``, the
    ``sgme`` command 0): Throttled while the file's previous full re-refine is still running,
    or finished less than ``cooldown`` seconds ago. The request is recorded in the index, so
    every API process applies the same cooldown.
    """
    refs.check_file_id(file_id)
    with db.transaction() as conn:
        row = index.get_file(conn, file_id, for_update=True)
        if row is None or not reader.visible(row, agents):
            raise reader.missing(file_id)
        if row.status == Status.PENDING:
            raise errors.Conflict(f"file {file_id} has nothing flushed yet")
        now = db.now()
        if cooldown > 0:
            _check_cooldown(conn, row, cooldown, now)
        index.restart_refinement(conn, file_id, now=now)
        stmt = database.insert(conn, tables.full_refines).values(
            file_id=file_id, requested_at=now, finished_at=None
        )
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["file_id"], set_={"requested_at": now, "finished_at": None}
            )
        )


def _check_cooldown(
    conn: sa.Connection, row: tables.FileRow, cooldown: float, now: dt.datetime
) -> None:
    """Throttled while the last full re-refine of ``row`` runs or finished < ``cooldown`` ago."""
    t = tables.full_refines.c
    last = conn.execute(sa.select(t.requested_at, t.finished_at).where(t.file_id == row.file_id))
    found = last.first()
    if found is None:
        return
    requested_at, finished_at = found
    # Still running: nothing of it committed yet, and the file can still be refined (a failed
    # or archived one is not running; its cooldown counts from the request).
    running = (
        finished_at is None
        and row.last_refined_seq == 0
        and row.flushed_seq > 0
        and row.status in tables.REFINABLE
    )
    if running:
        raise errors.Throttled(
            f"a full re-refine of file {row.file_id} (asked for at {tables.iso(requested_at)}) "
            f"is still running; another may start {cooldown:g} s after it finishes",
            retry_after=cooldown,
        )
    since = finished_at or requested_at
    wait = (since - now).total_seconds() + cooldown
    if wait > 0:
        raise errors.Throttled(
            f"file {row.file_id} was fully re-refined at {tables.iso(since)}; another full "
            f"re-refine may start in {math.ceil(wait)} s (refine_cooldown_seconds: {cooldown:g})",
            retry_after=wait,
        )


_FINISH_FULL = database.Prepared(
    sa.update(tables.full_refines)
    .where(
        tables.full_refines.c.file_id == sa.bindparam("file_id"),
        tables.full_refines.c.finished_at.is_(None),
    )
    .values(finished_at=sa.bindparam("now", type_=tables.full_refines.c.finished_at.type))
)


def _finish_full(conn: sa.Connection, file_id: str, now: dt.datetime) -> None:
    """The first segment of a full re-refine committed: its cooldown starts now."""
    _FINISH_FULL.execute(conn, {"file_id": file_id, "now": now})
