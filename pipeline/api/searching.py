"""``GET /v1/search``: full-text search over every raw message the caller may read."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BeforeValidator

from pipeline import catalog, clock, hybrid, refs, search, terms, validation, vocabulary
from pipeline.api import models
from pipeline.api.deps import ServiceDep, problems
from pipeline.api.security import Reader

router = APIRouter(tags=["search"])
Role = vocabulary.Role


def _dated(value: object) -> object:
    # What the schema says (a date-time, RFC 3339), not also what pydantic would read as one:
    # "0" or "20260803" as Unix seconds.
    if isinstance(value, str) and not _DATE.match(value):
        raise ValueError(f"must be an RFC 3339 date-time, got {value[:40]!r}")
    return value


_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
Time = Annotated[dt.datetime | None, BeforeValidator(_dated)]


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """A time parameter as the index compares times (:func:`pipeline.clock.naive_utc`)."""
    return None if value is None else clock.naive_utc(value)


@router.get("/v1/search", response_model=models.Hits, responses=problems(422, 503))
def search_messages(
    service: ServiceDep,
    caller: Reader,
    q: Annotated[
        str,
        Query(
            min_length=1,
            max_length=validation.MAX_QUERY_CHARS,
            pattern=r"^[^\x00]*[^\W_][^\x00]*$",
            description='a question, words and "quoted phrases"; any language, CJK too',
        ),
    ],
    match: Annotated[
        terms.Match,
        Query(
            description="any: ranked by relevance, a message need not hold every word "
            "(docs/search.md); all: only messages holding every word and phrase"
        ),
    ] = "any",
    agent_id: Annotated[str | None, Query(pattern=validation.AGENT_ID_PATTERN)] = None,
    session_key: Annotated[
        str | None, Query(min_length=1, max_length=512, pattern="^[^\\x00-\\x1f\\x7f]*$")
    ] = None,
    file_id: Annotated[
        str | None, Query(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    ] = None,
    role: Role | None = None,
    speaker: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=catalog.MAX_SPEAKER_CHARS,
            pattern="^[^\\x00-\\x1f\\x7f]*[^\\s\\x00-\\x1f\\x7f][^\\x00-\\x1f\\x7f]*$",
            description="only messages this speaker said (a name the session's metadata "
            "declares: speakers, speaker; any case)",
        ),
    ] = None,
    since: Annotated[Time, Query(description="messages at or after (RFC 3339)")] = None,
    until: Annotated[Time, Query(description="messages at or before (RFC 3339)")] = None,
    limit: Annotated[int, Query(ge=1, le=search.MAX_LIMIT)] = search.DEFAULT_LIMIT,
    context: Annotated[
        int,
        Query(
            ge=0,
            le=search.MAX_CONTEXT,
            description="turns before and after each hit to return with it (in before and "
            "after; a turn is shown once: a hit, or around the best hit next to it)",
        ),
    ] = 0,
    ref_time: Annotated[
        Time,
        Query(
            description="when the question is asked (RFC 3339; default now): a date it names "
            '("last Tuesday", "in May 2023", "昨天") is resolved against it'
        ),
    ] = None,
    mode: Annotated[
        hybrid.Mode | None,
        Query(
            description="lexical: words only; hybrid: words and meaning fused (without "
            "search_embedder set: words only, and ranking.fallback says so); default: hybrid "
            "when an embedder is set (docs/search.md)"
        ),
    ] = None,
) -> dict[str, Any]:
    """The messages that best match ``q``, best first, each with its ``source_ref`` and a
    snippet; filters combine. Only the caller's agents are searched. ``match=any`` ranks by
    relevance (BM25 with stemming, and the turns around a match); ``match=all`` finds the
    messages that hold every word and phrase."""
    filters = catalog.Filters(
        agents=caller.agents,
        agent_id=agent_id,
        session_key=session_key,
        file_id=file_id,
        role=role,
        speaker=speaker,
        since=utc(since),
        until=utc(until),
    )
    window = service.window(q, utc(ref_time)) if match == "any" else None
    found, how = service.hybrid.ranked(
        q, filters, limit=limit, match=match, mode=mode, context=context, window=window
    )
    return {**search.hits_of(found, window), "ranking": how.to_json()}
