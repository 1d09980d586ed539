"""The shapes of every answer the API gives, as pydantic models: they make ``/openapi.json``
describe each response, and :mod:`pipeline.client` parses answers with them. They import no
server code (no SQLAlchemy, no FastAPI), so that a client loads only what it uses; the server
reads them as :mod:`pipeline.api.models`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline import refs, vocabulary

FileId = str  # documented with FILE_ID_PATTERN where it is a parameter


class Model(BaseModel):
    """Answers may gain fields; clients should ignore the ones they don't know."""

    model_config = ConfigDict(extra="allow")


class Problem(Model):
    """An RFC 9457 problem document; ``type`` is ``urn:sgme:problem:<kind>``."""

    type: str = Field(examples=["urn:sgme:problem:not-found"])
    title: str
    status: int
    detail: str
    expected_sequence: int | None = Field(
        None,
        description="with type urn:sgme:problem:out-of-order: the sequence the session "
        "expects next",
    )


class Appended(Model):
    """Answer of ``POST /v1/append``: where the messages are (or will be) in the file."""

    file_id: str = Field(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    first_seq: int
    last_seq: int
    source_refs: list[str]
    status: str = Field(description="the file's status when the answer was made")
    replayed: bool = Field(
        False,
        description="true when the idempotency_key was seen before: nothing was written, and "
        "this is the answer the first request got",
    )
    redacted: int = Field(
        0,
        description="how many secrets (credentials of well-known forms) were replaced by "
        "[REDACTED:<kind>] markers before the messages were stored; never what they were",
    )
    erased: int = Field(
        0,
        description="how many of the messages were not stored because their idempotency_key "
        "(or legacy_key) was erased: the erasure keeps the keys, so that what was erased "
        "stays erased. Then nothing was written, file_id is the erased file's and "
        "source_refs is empty",
    )


class Uploaded(Model):
    """Answer of ``POST /v1/uploads``."""

    file_id: str = Field(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    source_ref: str
    redacted: int = Field(0, description="secrets replaced by markers before it was stored")


class Segment(Model):
    """The segment ``lo < seq <= hi`` an L1 item was refined from."""

    lo: int
    hi: int


class RefineRequested(Model):
    """A full re-refine accepted, for a caller that may not read the file's row (a token
    with the refine scope and not the read one)."""

    file_id: str = Field(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    refine: Literal["requested"] = "requested"


class File(Model):
    """A file's index row."""

    file_id: str = Field(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    path: str
    source_type: vocabulary.SourceType
    agent_id: str
    session_key: str
    metadata: dict[str, Any]
    started_at: str
    ended_at: str | None
    status: vocabulary.Status
    next_seq: int
    flushed_seq: int
    flushed_bytes: int
    chain_head: str | None
    flush_pending: bool
    flushed_at: str | None
    last_refined_seq: int
    refined_at: str | None
    refine_epoch: int
    refine_lease_until: str | None
    archived_at: str | None
    created_at: str
    updated_at: str
    message_count: int
    pending_messages: int
    next_sequence: int | None = Field(
        None,
        description="the append sequence the session expects next; null when its appends "
        "carry no sequence",
    )


class Files(Model):
    """A page of files; pass ``next_cursor`` back as ``cursor`` for the next one."""

    files: list[File]
    next_cursor: str | None


class Session(Model):
    """One session of ``GET /v1/sessions``."""

    file_id: str = Field(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    agent_id: str
    source_type: vocabulary.SourceType
    session_key: str
    title: str = Field(
        description="the source's title (or an upload's file name), else the first words of "
        "the first user message"
    )
    started_at: str
    ended_at: str | None
    message_count: int
    status: vocabulary.Status
    origin: str | None = Field(None, description="what wrote it: an importer, a client")
    cwd: str | None = Field(None, description="the agent's working directory, when recorded")


class Sessions(Model):
    """A page of sessions, newest first: ``offset + 1`` to ``offset + len(sessions)`` of
    ``total``; pass ``next_offset`` back as ``offset`` for the next (null on the last)."""

    sessions: list[Session]
    total: int
    offset: int
    limit: int
    next_offset: int | None


class Message(Model):
    """One stored message (``document.Message.to_json``)."""

    seq: int
    ts: str
    role: vocabulary.Role
    content: str
    tool_name: str | None
    source_ref: str


class Messages(Model):
    """A page of a file's messages; pass ``next_after_seq`` back as ``after_seq`` for the
    next (an empty page ends it)."""

    file_id: str
    messages: list[Message]
    next_after_seq: int | None


class Ref(Model):
    """The message a source_ref names, with its neighbours."""

    source_ref: str
    file_id: str
    agent_id: str
    session_key: str
    source_type: vocabulary.SourceType
    message: Message
    before: list[Message]
    after: list[Message]


class L1Item(Model):
    """One L1 item with the raw messages it stands on."""

    id: int
    file_id: str
    agent_id: str
    kind: str
    content: str
    source_refs: list[str]
    refiner: str
    segment: Segment
    created_at: str


class L1Items(Model):
    """A page of L1 items; pass ``next_after`` back as ``after`` for the next one."""

    items: list[L1Item]
    next_after: int | None


class Health(Model):
    """Whether the index answers and the data directory is writable."""

    status: Literal["ok", "degraded"]
    index: str
    data_dir: str
    journal_backlog: dict[str, int] | None = None
    deployment: str | None = Field(
        None,
        description="this store's identity: a service that enqueues sgme.append tasks into "
        "a shared broker stamps them with it (the sgme_deployment header)",
    )
    process: int | None = Field(
        None, description="the answering process (`sgme api --workers N` runs several)"
    )


class Turn(Model):
    """A turn around a search hit (``GET /v1/search?context=N``), its text cut to
    ``search_context_chars``."""

    source_ref: str
    seq: int
    ts: str
    role: vocabulary.Role
    text: str


class Hit(Model):
    """One search hit: the message's source_ref, where it is, and a snippet of its text."""

    source_ref: str
    file_id: str
    seq: int
    ts: str
    role: vocabulary.Role
    agent_id: str
    session_key: str
    snippet: str
    score: float = Field(description="higher is better; comparable within one answer only")
    before: list[Turn] = Field(
        default=[], description="the turns just before it (context=N), oldest first"
    )
    after: list[Turn] = Field(default=[], description="the turns just after it (context=N)")


class Window(Model):
    """The time window a date in the question named, searched besides the whole store."""

    since: str
    until: str
    matched: str = Field(description="the words of the question that named it")


class HowRanked(Model):
    """How a search was ranked (docs/search.md, semantic search)."""

    mode: vocabulary.SearchMode  #: what ranked the hits
    model: str | None = None  #: the embedder's model, when one is set
    #: flushed messages of the caller's agents without a vector of ``model`` yet (they rank
    #: by their words only)
    embedding_lag: int | None = None
    fallback: str | None = None  #: why a hybrid search ranked lexically


class Hits(Model):
    """Answer of ``GET /v1/search``, best first."""

    hits: list[Hit]
    window: Window | None = Field(
        default=None,
        description='the window a date in the question ("in May 2023", "last Tuesday", '
        '"昨天") named, resolved against ref_time; its hits are fused with the rest',
    )
    ranking: HowRanked | None = None


class AuditRecord(Model):
    """One row of the audit trail: a message redacted or a file erased — who, when, why and
    the sha256 of what was removed, never the text."""

    id: int
    action: Literal["redact", "erase"]
    file_id: str
    agent_id: str
    seq: int | None
    source_ref: str | None
    reason: str
    actor: str = Field(description="who: the token's id and name, or the sgme command's user")
    created_at: str
    finished_at: str | None = Field(description="null while a crash left it unfinished")
    removed_sha256: str = Field(description="sha256 of the removed body (or file), hex")
    removed_bytes: int
    messages: int


class AuditRecords(Model):
    """A page of the audit trail, oldest first; pass ``next_after`` back as ``after``."""

    records: list[AuditRecord]
    next_after: int | None


class Redacted(Ref):
    """Answer of ``POST /v1/refs/{ref}/redact``: the message as it now reads (its tombstone),
    with its neighbours, and the redaction's audit record."""

    redaction: AuditRecord


class Policy(Model):
    """Whether an agent's appends have their secrets redacted before they are stored."""

    agent_id: str
    redact_secrets: bool
    source: Literal["default", "agent"] = Field(
        description="default: the redact_secrets setting; agent: the agent's own policy"
    )
    updated_at: str | None
    updated_by: str | None
