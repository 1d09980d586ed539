"""The HTTP API (FastAPI): decode → call into ``pipeline`` → map errors to problem+json.

Every error is an RFC 9457 problem document whose ``type`` is stable:
``urn:sgme:problem:<kind>`` with the kinds of :mod:`pipeline.errors`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Literal

import sqlalchemy as sa
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline import document, errors, index, journal, metrics, raw, refine, store
from pipeline.settings import Settings

log = logging.getLogger(__name__)
PROBLEM = "application/problem+json"
Kick = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# request and response shapes (validated again, with precise messages, by pipeline.journal)


class MessageIn(BaseModel):
    """One message to append."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant", "tool", "system"]
    content: str
    # Strict: in lax mode pydantic turns ``true`` into 1.0, which would be stored as 1970.
    ts: StrictStr | StrictInt | StrictFloat | None = Field(
        None, description="ISO 8601 (offset converted to UTC; none means UTC) or Unix seconds"
    )
    tool_name: str | None = Field(None, description="required for role 'tool'")


class AppendIn(BaseModel):
    """Body of ``POST /v1/append``."""

    model_config = ConfigDict(extra="forbid")
    agent_id: str = Field(..., examples=["hermes"])
    session_key: str = Field(..., examples=["20260803_191806_5b6c69"])
    source_type: Literal["session", "external"] = "session"
    metadata: dict[str, Any] | None = None
    idempotency_key: str | None = None
    messages: list[MessageIn]


class AppendOut(BaseModel):
    """Answer of ``POST /v1/append``."""

    file_id: str
    first_seq: int
    last_seq: int
    source_refs: list[str]
    status: str


class UploadIn(BaseModel):
    """Body of ``POST /v1/uploads``: one UTF-8 text document."""

    model_config = ConfigDict(extra="forbid")
    agent_id: str
    filename: str
    content: str
    metadata: dict[str, Any] | None = None
    idempotency_key: str | None = None


class UploadOut(BaseModel):
    """Answer of ``POST /v1/uploads``."""

    file_id: str
    source_ref: str


class MessageOut(BaseModel):
    """One stored message."""

    seq: int
    ts: str
    role: str
    content: str
    tool_name: str | None
    source_ref: str


class MessagesOut(BaseModel):
    """Answer of ``GET /v1/files/{file_id}/messages``."""

    file_id: str
    messages: list[MessageOut]


def _message_json(file_id: str, m: document.Message) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "ts": m.ts,
        "role": m.role,
        "content": m.content,
        "tool_name": m.tool_name,
        "source_ref": f"{file_id}:{m.seq}",
    }


def _quiet(kick: Kick) -> Kick:
    def call(file_id: str) -> None:
        try:
            kick(file_id)
        except Exception:  # the broker may be down; the sweeper re-kicks from the index
            log.warning("could not enqueue work for %s; the sweeper will", file_id, exc_info=True)

    return call


def _problem(status: int, kind: str, title: str, detail: Any) -> JSONResponse:
    return JSONResponse(
        {"type": f"urn:sgme:problem:{kind}", "title": title, "status": status, "detail": detail},
        status_code=status,
        media_type=PROBLEM,
    )


# ---------------------------------------------------------------------------------------------
# the app


@dataclasses.dataclass
class State:
    """What the handlers need."""

    settings: Settings
    engine: sa.Engine
    kick: Kick
    dispatch: Kick


def _nothing(_file_id: str) -> None:
    return None


def create_app(
    settings: Settings, *, engine: sa.Engine, kick: Kick, dispatch: Kick = _nothing
) -> FastAPI:
    """The API over ``engine`` and ``settings.data_dir``.

    ``kick(file_id)`` enqueues a flush; ``dispatch(file_id)`` enqueues its refinement. Both
    may fail silently: the journal and the index keep the state, the beat sweeps catch up.
    """
    state = State(settings=settings, engine=engine, kick=_quiet(kick), dispatch=_quiet(dispatch))
    app = FastAPI(
        title="SGME L0",
        version="0.1.0",
        description="The raw layer of SGME: append-only Markdown transcripts, indexed.",
    )
    app.state.sgme = state

    @app.exception_handler(errors.SgmeError)
    async def _sgme_error(_request: Request, exc: errors.SgmeError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("%s: %s", exc.type, exc.detail)
        return _problem(exc.status, exc.type, type(exc).__name__, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return _problem(422, errors.InvalidInput.type, "InvalidInput", "; ".join(details))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not-found" if exc.status_code == 404 else "http-error"
        return _problem(exc.status_code, kind, "HTTPError", exc.detail)

    limits = settings.limits

    @app.post("/v1/append", response_model=AppendOut, status_code=202)
    def append(
        body: AppendIn,
        response: Response,
        wait: Literal["flushed"] | None = Query(
            None, description="'flushed': answer only once the messages are in the file"
        ),
    ) -> dict[str, Any]:
        """Append messages to a session (created on first use). Acknowledged = durable in the
        journal; the file is written by a flush right after."""
        result = journal.ingest(engine, body.model_dump(exclude_unset=True), limits=limits)
        answer = result.to_json()
        if wait == "flushed":
            try:
                journal.flush(
                    engine, settings.data_dir, result.file_id, lock_timeout=settings.lock_timeout
                )
            except errors.SgmeError as exc:
                # The append is acknowledged (journaled) either way: answer 202 rather than an
                # error a client would retry, and let the queue finish the flush.
                log.warning("wait=flushed: flush of %s failed: %s", result.file_id, exc.detail)
                state.kick(result.file_id)
                return answer
            answer["status"] = raw.get_file(engine, result.file_id).status
            response.status_code = 200
        elif result.kick:
            state.kick(result.file_id)
        return answer

    @app.post("/v1/uploads", response_model=UploadOut, status_code=201)
    def upload(body: UploadIn) -> dict[str, Any]:
        """Store one UTF-8 text document as a file of its own."""
        result = journal.ingest_upload(engine, body.model_dump(exclude_unset=True), limits=limits)
        if result.kick:
            state.kick(result.file_id)
        return {"file_id": result.file_id, "source_ref": result.source_refs[0]}

    @app.get("/v1/files")
    def list_files(
        agent_id: str | None = None,
        status: str | None = None,
        source_type: str | None = None,
        limit: int = Query(100, ge=1, le=1000),
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Files ordered by file_id; pass ``next_cursor`` back as ``cursor`` for the next page."""
        if status is not None and status not in index.STATUSES:
            raise errors.InvalidInput(f"status must be one of {', '.join(index.STATUSES)}")
        if source_type is not None:
            document.check_source_type(source_type)
        with index.transaction(engine) as conn:
            rows = index.list_files(
                conn,
                agent_id=agent_id,
                status=status,
                source_type=source_type,
                after=cursor,
                limit=limit,
            )
        next_cursor = rows[-1].file_id if len(rows) == limit else None
        return {"files": [row.to_json() for row in rows], "next_cursor": next_cursor}

    @app.get("/v1/files/{file_id}")
    def get_file(file_id: str) -> dict[str, Any]:
        """The file's index row."""
        return raw.get_file(engine, file_id).to_json()

    @app.get(
        "/v1/files/{file_id}/raw",
        response_class=Response,
        responses={200: {"content": {"text/markdown": {}}}},
    )
    def get_raw(file_id: str) -> Response:
        """The file's committed bytes, exactly as on disk."""
        row = raw.get_file(engine, file_id)
        return Response(
            raw.read_bytes(settings.data_dir, row), media_type="text/markdown; charset=utf-8"
        )

    @app.get("/v1/files/{file_id}/messages", response_model=MessagesOut)
    def get_messages(
        file_id: str,
        after_seq: int = Query(0, ge=0),
        limit: int = Query(100, ge=1, le=1000),
    ) -> dict[str, Any]:
        """Flushed messages with ``seq > after_seq``."""
        found = raw.messages(engine, settings.data_dir, file_id, after_seq=after_seq, limit=limit)
        return {"file_id": file_id, "messages": [_message_json(file_id, m) for m in found]}

    @app.get("/v1/refs/{ref}")
    def get_ref(ref: str, context: int = Query(1, ge=0, le=50)) -> dict[str, Any]:
        """The message a source_ref (``file_id:seq``) names, with its neighbours."""
        found = raw.resolve(engine, settings.data_dir, ref, context=context)
        file_id = found.file.file_id
        return {
            "source_ref": f"{file_id}:{found.message.seq}",
            "file_id": file_id,
            "agent_id": found.file.agent_id,
            "session_key": found.file.session_key,
            "source_type": found.file.source_type,
            "message": _message_json(file_id, found.message),
            "before": [_message_json(file_id, m) for m in found.before],
            "after": [_message_json(file_id, m) for m in found.after],
        }

    @app.post("/v1/files/{file_id}/refine", status_code=202)
    def refine_file(file_id: str) -> dict[str, Any]:
        """Full re-refine: ``last_refined_seq = 0``; the file's L1 items are replaced."""
        refine.request_full(engine, file_id)
        state.dispatch(file_id)
        return raw.get_file(engine, file_id).to_json()

    @app.get("/v1/l1")
    def list_l1(
        file_id: str | None = None,
        agent_id: str | None = None,
        after: int = Query(0, ge=0, description="return items with id > after"),
        limit: int = Query(100, ge=1, le=1000),
    ) -> dict[str, Any]:
        """L1 items, oldest first; each source_ref resolves through ``/v1/refs/…``."""
        if file_id is not None:
            document.check_file_id(file_id)
        with index.transaction(engine) as conn:
            items = index.list_l1_items(
                conn, file_id=file_id, agent_id=agent_id, after=after, limit=limit
            )
        next_after = items[-1].id if len(items) == limit else None
        return {"items": [item.to_json() for item in items], "next_after": next_after}

    @app.get("/metrics", response_class=Response)
    def prometheus() -> Response:
        """Prometheus metrics: journal backlog, flush latency, refinement lag, anomalies."""
        return Response(metrics.render(engine), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/health")
    def health() -> JSONResponse:
        """Whether the index answers and the data directory is writable."""
        checks: dict[str, Any] = {}
        try:
            with index.transaction(engine) as conn:
                rows, messages = index.journal_backlog(conn)
            checks["index"] = "ok"
            checks["journal_backlog"] = {"rows": rows, "messages": messages}
        except errors.SgmeError as exc:
            checks["index"] = exc.detail
        probe = settings.data_dir / ".health"
        try:
            store.remove(probe)
            store.create(probe, b"ok")
            store.remove(probe)
            checks["data_dir"] = "ok"
        except errors.SgmeError as exc:
            checks["data_dir"] = exc.detail
        ok = checks["index"] == "ok" and checks["data_dir"] == "ok"
        return JSONResponse(
            {"status": "ok" if ok else "degraded", **checks}, status_code=200 if ok else 503
        )

    return app
