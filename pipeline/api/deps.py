"""What route handlers receive: the service, and the parameters several routes share."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Request

from pipeline import validation
from pipeline.api import models
from pipeline.service import Service

PROBLEM = "application/problem+json"


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(_service)]
FileIdPath = Annotated[
    str, Path(pattern=validation.FILE_ID_PATTERN, description="a file_id (UUID4)")
]


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for routes: each status answered with a problem document."""
    reasons = {
        400: "bad request",
        404: "not found",
        409: "conflict",
        413: "request body too large",
        422: "invalid input",
        429: "too soon: repeat after Retry-After seconds",
        503: "unavailable; retry with backoff",
    }
    schema = {"$ref": "#/components/schemas/Problem"}
    return {
        status: {
            "description": reasons.get(status, "error"),
            "content": {PROBLEM: {"schema": schema}},
        }
        for status in statuses
    }


__all__ = ["FileIdPath", "ServiceDep", "models", "problems"]
