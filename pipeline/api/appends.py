"""``POST /v1/append`` and ``POST /v1/uploads``: the acknowledgement points.

The bodies are read as bytes and validated once, off the event loop, by
:mod:`pipeline.validation` (pydantic's JSON parser), the same models the Celery path uses.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from pipeline import auth, validation
from pipeline.api import models
from pipeline.api.deps import ServiceDep, problems
from pipeline.api.security import Appender
from pipeline.service import Appended, Service

router = APIRouter(tags=["append"])


def _body(model: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


@router.post(
    "/v1/append",
    status_code=202,
    response_model=models.Appended,
    responses={
        200: {"model": models.Appended, "description": "with wait=flushed: in the file"},
        **problems(408, 409, 413, 422, 503, 507),
    },
    openapi_extra=_body("AppendBody"),
)
async def append(
    request: Request,
    response: Response,
    service: ServiceDep,
    caller: Appender,
    # Not Optional in the schema: omitted means "don't wait"; there is no null to send.
    wait: Literal["flushed"] = Query(
        None,
        description="'flushed': answer once the messages are in the file",
    ),
) -> dict[str, Any]:
    """Append messages to a session (created on first use). Acknowledged (202) = durable in
    the journal; the file is written by a flush right after. With ``wait=flushed`` the answer
    is 200 once the messages are in the file (202 if that flush failed: it is retried, and
    the append stands)."""
    body = await request.body()
    done = await run_in_threadpool(_append, service, caller, body, wait == "flushed")
    if done.flushed:
        response.status_code = 200
    return done.to_json()


@router.post(
    "/v1/uploads",
    status_code=201,
    response_model=models.Uploaded,
    responses=problems(408, 409, 413, 422, 503, 507),
    openapi_extra=_body("UploadBody"),
)
async def upload(request: Request, service: ServiceDep, caller: Appender) -> dict[str, Any]:
    """Store one UTF-8 text document as a file of its own."""
    body = await request.body()
    done = await run_in_threadpool(_upload, service, caller, body)
    return {"file_id": done.result.file_id, "source_ref": done.result.source_refs[0]}


def _append(service: Service, caller: auth.Caller, body: bytes, wait: bool) -> Appended:
    """Validate, check the token holds the body's agent_id (403), then append."""
    parsed = validation.parse_append(body, service.settings.limits)
    caller.require_agent(parsed.agent_id)
    return service.append(parsed, wait=wait)


def _upload(service: Service, caller: auth.Caller, body: bytes) -> Appended:
    """Validate, check the token holds the body's agent_id (403), then store."""
    parsed = validation.parse_upload(body, service.settings.limits)
    caller.require_agent(parsed.agent_id)
    return service.upload(parsed)
