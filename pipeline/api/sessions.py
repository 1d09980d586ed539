"""``GET /v1/sessions``: sessions newest first, with titles, time spans and message counts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from pipeline import sessions, validation, vocabulary
from pipeline.api import models
from pipeline.api.deps import ServiceDep, problems
from pipeline.api.searching import Time, utc
from pipeline.api.security import Reader

router = APIRouter(tags=["files"])
SourceType = vocabulary.SourceType


@router.get("/v1/sessions", response_model=models.Sessions, responses=problems(422, 503))
def list_sessions(
    service: ServiceDep,
    caller: Reader,
    agent_id: Annotated[str | None, Query(pattern=validation.AGENT_ID_PATTERN)] = None,
    source_type: SourceType | None = None,
    since: Annotated[
        Time, Query(description="sessions whose latest message is at or after (RFC 3339)")
    ] = None,
    until: Annotated[
        Time, Query(description="sessions whose first message is at or before (RFC 3339)")
    ] = None,
    cwd: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=sessions.MAX_CWD_CHARS,
            pattern="^[^\\x00-\\x1f\\x7f]*$",
            description="sessions recorded in this directory or a directory below it (their "
            "metadata's cwd)",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=sessions.MAX_LIMIT)] = sessions.DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, le=sessions.MAX_OFFSET)] = 0,
) -> dict[str, Any]:
    """Sessions (files with at least one message) newest first — by their latest message —
    each with its title (the source's, or the first words of its first user message), time
    span and message count, and ``total``, the number of sessions that match; page with
    ``offset = next_offset``. ``cwd`` keeps the sessions of one project: those recorded in that
    directory or below it. Only the token's agents' sessions are listed."""
    filters = sessions.Filters(
        agents=caller.listing(agent_id),
        source_type=source_type,
        since=utc(since),
        until=utc(until),
        cwd=cwd,
    )
    return service.browsing.list_sessions(filters, offset=offset, limit=limit).to_json()
