"""What route handlers receive: the service, and the parameters several routes share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse

from pipeline import errors, refs
from pipeline.api import models
from pipeline.service import Service

PROBLEM = "application/problem+json"


def problem(
    status: int,
    kind: str,
    title: str,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    members: Mapping[str, Any] | None = None,
) -> JSONResponse:
    """A problem+json answer (RFC 9457), with the extension ``members`` an error carries."""
    body = {"type": errors.problem_type(kind), "title": title, "status": status, "detail": detail}
    body.update(members or {})
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers or None)


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(_service)]
FileIdPath = Annotated[
    str,
    Path(
        pattern=refs.FILE_ID_PATTERN,
        description="a file_id (UUID4)",
        json_schema_extra={"format": "uuid"},
    ),
]


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for routes: each status answered with a problem document (and 500,
    which any route answers for a bug)."""
    reasons = {
        400: "bad request",
        404: "not found",
        409: "conflict",
        410: "gone: erased on purpose",
        408: "the request body came too slowly",
        413: "request body too large",
        422: "invalid input",
        429: "too soon: repeat after Retry-After seconds",
        500: "a bug (logged by the server)",
        503: "unavailable; retry after Retry-After seconds, or with backoff",
        507: "the data volume is full; retry after Retry-After seconds",
    }
    schema = {"$ref": "#/components/schemas/Problem"}
    return {
        status: {
            "description": reasons.get(status, "error"),
            "content": {PROBLEM: {"schema": schema}},
        }
        for status in sorted({*statuses, 500})
    }


__all__ = ["FileIdPath", "ServiceDep", "models", "problems"]
