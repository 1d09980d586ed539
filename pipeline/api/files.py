"""Reading: files, their raw bytes, their messages, and single messages by source_ref."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from pipeline import refs, tables, validation, vocabulary
from pipeline.api import models
from pipeline.api.deps import FileIdPath, ServiceDep, problems
from pipeline.api.security import Reader

router = APIRouter(tags=["files"])

SourceType = vocabulary.SourceType


@router.get("/v1/files", response_model=models.Files, responses=problems(422, 503))
def list_files(
    service: ServiceDep,
    caller: Reader,
    agent_id: Annotated[str | None, Query(pattern=validation.AGENT_ID_PATTERN)] = None,
    status: tables.Status | None = None,
    source_type: SourceType | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        str | None, Query(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    ] = None,
) -> dict[str, Any]:
    """Files ordered by file_id; pass ``next_cursor`` back as ``cursor`` for the next page.
    Only the token's agents' files are listed (an ``agent_id`` it does not hold lists none)."""
    rows = service.list_files(
        agents=caller.listing(agent_id),
        status=status,
        source_type=source_type,
        after=cursor,
        limit=limit,
    )
    next_cursor = rows[-1].file_id if len(rows) == limit else None
    return {"files": [row.to_json() for row in rows], "next_cursor": next_cursor}


@router.get(
    "/v1/files/{file_id}", response_model=models.File, responses=problems(404, 410, 422, 503)
)
def get_file(file_id: FileIdPath, service: ServiceDep, caller: Reader) -> dict[str, Any]:
    """The file's index row."""
    return service.get_file(file_id, agents=caller.agents).to_json()


@router.get(
    "/v1/files/{file_id}/raw",
    response_class=Response,
    responses={
        200: {"content": {"text/markdown": {"schema": {"type": "string"}}}},
        **problems(404, 409, 410, 422, 503),
    },
)
def get_raw(file_id: FileIdPath, service: ServiceDep, caller: Reader) -> Response:
    """The file's committed bytes, exactly as on disk (decompressed if archived), streamed."""
    row, chunks = service.raw(file_id, agents=caller.agents)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="text/markdown; charset=utf-8",
        headers={"Content-Length": str(row.flushed_bytes)},
    )


@router.get(
    "/v1/files/{file_id}/messages",
    response_model=models.Messages,
    responses=problems(404, 409, 410, 422, 503),
)
def get_messages(
    file_id: FileIdPath,
    service: ServiceDep,
    caller: Reader,
    after_seq: Annotated[int, Query(ge=0, le=refs.MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Flushed messages with ``seq > after_seq``: up to ``limit``, and no more than
    ``http_max_page_bytes`` of content (at least one message); page on with
    ``after_seq = next_after_seq``."""
    found = service.messages(
        file_id,
        after_seq=after_seq,
        limit=limit,
        agents=caller.agents,
    )
    next_after = found[-1].seq if found else None
    return {
        "file_id": file_id,
        "messages": [m.to_json(file_id) for m in found],
        "next_after_seq": next_after,
    }


@router.get(
    "/v1/refs/{ref}", response_model=models.Ref, responses=problems(404, 409, 410, 422, 503)
)
def get_ref(
    ref: Annotated[str, Path(pattern=refs.SOURCE_REF_PATTERN, description="file_id:seq")],
    service: ServiceDep,
    caller: Reader,
    context: Annotated[int, Query(ge=0, le=50)] = 1,
) -> dict[str, Any]:
    """The message a source_ref (``file_id:seq``) names, with up to ``context`` neighbours on
    each side (the nearest first, within ``http_max_page_bytes`` of content)."""
    found = service.resolve(
        ref,
        context=context,
        agents=caller.agents,
    )
    file_id = found.file.file_id
    return {
        "source_ref": refs.format(file_id, found.message.seq),
        "file_id": file_id,
        "agent_id": found.file.agent_id,
        "session_key": found.file.session_key,
        "source_type": found.file.source_type,
        "message": found.message.to_json(file_id),
        "before": [m.to_json(file_id) for m in found.before],
        "after": [m.to_json(file_id) for m in found.after],
    }
