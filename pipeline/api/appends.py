"""``POST /v1/append`` and ``POST /v1/uploads``: the acknowledgement points.

The bodies are read as bytes and validated once, off the event loop, by
:mod:`pipeline.validation` (pydantic's JSON parser), the same models the Celery path uses.

``POST /v1/append`` is answered by :class:`FastAppend`, a middleware inside the Host,
same-origin and body-size guards, without the router and FastAPI's exception layers: the
same handler, the same token check and problem+json answers, the same durability (the 202
leaves once the journal's commit returned). The route stays for the schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from pipeline import auth, errors, validation
from pipeline.api import models, security
from pipeline.api.batching import AppendBatcher
from pipeline.api.deps import ServiceDep, problems
from pipeline.api.security import Appender
from pipeline.service import Appended, Service

router = APIRouter(tags=["append"])
APPEND_PATH = "/v1/append"
#: bodies up to this size are validated on the committer thread, with their batch; a larger
#: one on a thread of its own first, so that it does not hold up the appends batched with it
BATCH_VALIDATION_BYTES = 64 * 1024


def _body(model: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_WAIT = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": "'flushed': answer once the messages are in the file",
    "schema": {"enum": ["flushed"], "type": "string"},
}


@router.post(
    APPEND_PATH,
    status_code=202,
    response_model=models.Appended,
    responses={
        200: {"model": models.Appended, "description": "with wait=flushed: in the file"},
        **problems(401, 403, 408, 409, 413, 422, 503, 507),
    },
    openapi_extra={**_body("AppendBody"), "parameters": [_WAIT], "security": security.BEARER},
)
async def append(request: Request) -> Response:
    """Append messages to a session (created on first use). Acknowledged (202) = durable in
    the journal; the file is written by a flush right after. With ``wait=flushed`` the answer
    is 200 once the messages are in the file (202 if that flush failed: it is retried, and
    the append stands)."""
    # The hottest route reads its request itself: FastAPI's dependency solving and response
    # validation cost more than the group commit (bench/bench_http.py, docs/benchmarks.md).
    service: Service = request.app.state.service
    caller = await security.authorize(request, "append")
    wait = request.query_params.getlist("wait")
    if wait not in ([], ["flushed"]):
        raise errors.InvalidInput(f"query parameter wait: must be 'flushed', not {wait!r}")
    body = await request.body()
    if wait:
        done = await run_in_threadpool(_append, service, caller, body, True)
    else:
        # Validated off the event loop, which only reads and answers requests.
        limits = service.settings.limits

        def prepare() -> validation.Append:
            parsed = validation.parse_append(body, limits)
            caller.require_agent(parsed.agent_id)
            return parsed

        if len(body) > BATCH_VALIDATION_BYTES:  # on a thread of its own: not the batch's time
            parsed = await run_in_threadpool(prepare)
            done = await batcher(request).append(lambda: parsed)
        else:
            done = await batcher(request).append(prepare)
    return JSONResponse(done.to_json(), status_code=200 if done.flushed else 202)


def batcher(request: Request) -> AppendBatcher:
    """The app's :class:`AppendBatcher` (made with the app: :func:`install`)."""
    found: AppendBatcher = request.app.state.append_batcher
    return found


def install(app: Any, service: Service) -> None:
    """Give ``app`` the committer of its appends (:mod:`pipeline.api.batching`)."""
    app.state.append_batcher = AppendBatcher(service)


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
    return {
        "file_id": done.result.file_id,
        "source_ref": done.result.source_refs[0],
        "redacted": done.redacted,
    }


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


class FastAppend:
    """ASGI middleware: ``POST /v1/append`` answered by :func:`append` straight away (placed
    inside the Host, same-origin and body guards); an error by ``refuse``, as the app's
    handlers answer it; everything else goes on to ``app``."""

    def __init__(self, app: ASGIApp, *, refuse: Callable[[errors.SgmeError], Response]) -> None:
        self.app = app
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != APPEND_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await append(Request(scope, receive))
        except ClientDisconnect:  # gone before its body arrived: nothing appended, no one to answer
            return
        except errors.SgmeError as exc:
            response = self.refuse(exc)
        except Exception as exc:  # a bug: logged with its traceback by refuse
            bug = errors.InternalError("internal error")
            bug.__cause__ = exc
            response = self.refuse(bug)
        await response(scope, receive, send)
