"""The FastAPI application: routers, the service dependency, and one mapping of every error
to an RFC 9457 problem document (``application/problem+json``); the web view (``/ui``), and
the plug-ins that serve more on the same app (entry point group :data:`PLUGINS`: the MCP
server at ``/mcp``, which builds on this API's routes and so cannot be imported by it)."""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from importlib import metadata as importlib_metadata
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from pipeline import errors, ui, validation
from pipeline.api import appends, files, models, ops, refine, removal, searching, security, sessions
from pipeline.api.deps import problem
from pipeline.api.server import BodyLimit
from pipeline.service import Service

log = logging.getLogger(__name__)

PLUGINS = "sgme.api"  #: entry point group: what else the API serves (``mcp``: ``/mcp``)
#: FastAPI's own OpenTelemetry (newer releases) asks on every request whether a provider is
#: configured; the service reports through Prometheus (``/metrics``) and has none
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class Plugin(Protocol):
    """What an entry point of :data:`PLUGINS` names: adds its routes to the app (whose
    ``state.service`` is set), answering its refusals with ``refuse``."""

    def __call__(self, app: FastAPI, refuse: Callable[[errors.SgmeError], Response]) -> None:
        """Serve the plug-in on ``app``."""
        ...


def answer(exc: errors.SgmeError) -> JSONResponse:
    """The problem+json answer of one of our errors, with the headers it calls for."""
    headers = security.headers(exc)
    name = type(exc).__name__
    return problem(exc.status, exc.type, name, exc.detail, headers=headers, members=exc.members())


def refuse(exc: errors.SgmeError) -> JSONResponse:
    """:func:`answer`, logged as the server's own failures are (a bug with its traceback)."""
    if isinstance(exc, errors.InternalError):
        log.error("%s: %s", exc.type, exc.detail, exc_info=exc)
    elif exc.status >= 500:
        log.warning("%s: %s", exc.type, exc.detail)
    return answer(exc)


def create_app(service: Service) -> FastAPI:
    """The API over ``service`` (its settings, db and queue)."""
    app = FastAPI(
        title="SGME L0",
        version="0.1.0",
        description="The raw layer of SGME: append-only Markdown transcripts, indexed.",
        # FastAPI's /docs and /redoc load their scripts from a CDN, on the origin that serves
        # /v1 and /ui: not served (the schema is, at /openapi.json, for any viewer)
        docs_url=None,
        redoc_url=None,
        **_NO_TELEMETRY,
    )
    app.state.service = service
    settings = service.settings
    app.state.verifier = service.verifier()
    appends.install(app, service)
    http = settings.http
    # added first, so it runs last: the append path past every guard, without the router
    app.add_middleware(appends.FastAppend, refuse=refuse)
    app.add_middleware(
        BodyLimit,
        max_bytes=http.max_request_bytes,
        timeout=http.body_timeout,
        min_rate=http.min_body_rate,
        linger=http.refusal_linger,
    )
    app.add_middleware(security.SingleValuedQuery, refuse=answer)
    app.add_middleware(
        security.SameOrigin, allowed=security.allowed_origins(settings), refuse=answer
    )
    # added last, so it runs first: a foreign Host is refused before anything else
    app.add_middleware(
        security.HostAllowlist, allowed=security.allowed_hosts(settings), refuse=answer
    )
    for module in (appends, files, sessions, searching, refine, removal, ops):
        app.include_router(module.router)

    ui.mount(app)
    for entry in sorted(importlib_metadata.entry_points(group=PLUGINS), key=lambda e: e.name):
        plugin: Plugin = entry.load()
        plugin(app, refuse=answer)

    @app.exception_handler(errors.SgmeError)
    async def _sgme_error(_request: Request, exc: errors.SgmeError) -> JSONResponse:
        return refuse(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = validation.describe_errors(exc.errors())
        return problem(422, errors.InvalidInput.type, "InvalidInput", detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not-found" if exc.status_code == 404 else "http-error"
        headers = exc.headers
        if exc.status_code == 405:  # every method of the path, not only its first route's
            allowed = _allowed(app, request, (headers or {}).get("Allow", ""))
            headers = {**(headers or {}), "Allow": allowed}
        return problem(exc.status_code, kind, "HTTPError", str(exc.detail), headers=headers)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_request: Request, _exc: ClientDisconnect) -> JSONResponse:
        # the client left before its request's body arrived: nothing was done, and no one
        # reads the answer (not a bug of ours to log)
        detail = "the client disconnected before its request body arrived"
        return problem(400, "http-error", "HTTPError", detail)

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=exc)
        return problem(500, errors.InternalError.type, "InternalError", "internal error")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi(app, service)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _allowed(app: FastAPI, request: Request, given: str) -> str:
    """The methods the request's path answers, over all its routes, from the schema (the
    router names only those of the first route whose path matched: GET and DELETE of
    /v1/files/{file_id} are two routes); ``given`` when the schema has no such path."""
    methods: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, request.url.path):
            methods |= {method.upper() for method in operations}
    return ", ".join(sorted(methods)) or given


def _openapi(app: FastAPI, service: Service) -> dict[str, Any]:
    """FastAPI's schema plus the request bodies the append routes parse themselves (with the
    configured limits) and the problem document every error answer carries."""
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    template = "#/components/schemas/{model}"
    for model in (*validation.schemas(service.settings.limits), models.Problem):
        body = model.model_json_schema(ref_template=template)
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
    _link(schema)
    security.document(schema, service.settings)
    return schema


#: what an acknowledgement names, and where it can be followed (OpenAPI links: clients and
#: tools such as schemathesis's stateful phase go from an append to its file and messages)
_FOLLOW = {
    "getFile": ("/v1/files/{file_id}", "get", "file_id", "$response.body#/file_id"),
    "getMessages": ("/v1/files/{file_id}/messages", "get", "file_id", "$response.body#/file_id"),
    "getRaw": ("/v1/files/{file_id}/raw", "get", "file_id", "$response.body#/file_id"),
    "refineFile": ("/v1/files/{file_id}/refine", "post", "file_id", "$response.body#/file_id"),
}


def _link(schema: dict[str, Any]) -> None:
    paths = schema["paths"]

    def operation_id(path: str, method: str) -> str:
        return str(paths[path][method]["operationId"])

    links = {
        name: {"operationId": operation_id(path, method), "parameters": {param: value}}
        for name, (path, method, param, value) in _FOLLOW.items()
    }
    ref = operation_id("/v1/refs/{ref}", "get")
    appended = {
        **links,
        "getRef": {"operationId": ref, "parameters": {"ref": "$response.body#/source_refs/0"}},
    }
    for status in ("200", "202"):
        paths["/v1/append"]["post"]["responses"][status]["links"] = appended
    uploaded = {
        "getFile": links["getFile"],
        "getRef": {"operationId": ref, "parameters": {"ref": "$response.body#/source_ref"}},
    }
    paths["/v1/uploads"]["post"]["responses"]["201"]["links"] = uploaded
