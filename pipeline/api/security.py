"""The API's side of :mod:`pipeline.auth`: the bearer token of each request, the scope each
route needs, the Host allowlist, and how all of it shows in answers and in ``/openapi.json``.

Checks run in this order, each answered with a problem document:
Host not allowed → 400; no, a malformed, unknown or revoked token → 401 with
``WWW-Authenticate: Bearer``; a scope the token lacks → 403 (before anything is looked up, so a
403 says nothing about what exists); another agent's file → 404 exactly as if it did not exist.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable, Collection
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pipeline import auth, errors
from pipeline.settings import Settings

REALM = "sgme"
ANY_HOST = "*"

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description=(
        "A token made by `sgme token create` (`sgme_…`). Required on every /v1/* path but "
        "/v1/health once any token exists or require_auth is set; /metrics needs an admin "
        "token when metrics_require_auth is set."
    ),
)


def _secret(request: Request) -> str | None:
    """The token of the ``Authorization`` header; None without one, "" (malformed) when the
    header is not ``Bearer <token>``."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


async def _verify(request: Request, *, required: bool = False) -> auth.Caller:
    """The request's caller: from the verifier's memory when it can answer, else in a thread
    (it reads the index)."""
    verifier: auth.Verifier = request.app.state.verifier
    secret = _secret(request)
    found = verifier.quick(secret, required=required)
    if found is not None:
        return found
    return await run_in_threadpool(verifier.caller, secret, required=required)


async def caller(request: Request, _: Annotated[Any, Security(bearer)] = None) -> auth.Caller:
    """The caller of a ``/v1/*`` request (:data:`auth.OPEN` while auth is off)."""
    return await _verify(request)


async def authorize(request: Request, scope: str) -> auth.Caller:
    """The caller of a request that needs ``scope``, checked as the ``Appender``/``Reader``
    dependencies check it: for a route that reads the request itself (the append path, where
    FastAPI's dependency solving cost more than the commit)."""
    who = await _verify(request)
    who.require(scope)
    return who


#: the OpenAPI ``security`` of a route that calls :func:`authorize` itself
BEARER: list[dict[str, list[str]]] = [{"bearer": []}]


def _scope(name: str) -> Any:
    async def dependency(who: Annotated[auth.Caller, Depends(caller)]) -> auth.Caller:
        who.require(name)
        return who

    dependency.__name__ = f"require_{name}"
    return Depends(dependency)


Appender = Annotated[auth.Caller, _scope("append")]
Reader = Annotated[auth.Caller, _scope("read")]
Refiner = Annotated[auth.Caller, _scope("refine")]
Admin = Annotated[auth.Caller, _scope("admin")]


async def metrics_caller(request: Request) -> None:
    """``/metrics``: open, unless ``metrics_require_auth`` asks for an admin token."""
    settings: Settings = request.app.state.service.settings
    if settings.metrics_require_auth:
        (await _verify(request, required=True)).require("admin")


def headers(exc: errors.SgmeError) -> dict[str, str]:
    """The headers an error's answer carries: the Bearer challenge of a 401 (and of a 403 for
    a scope, RFC 6750), ``Retry-After`` of an error that says when to come back."""
    if isinstance(exc, errors.Unauthorized):
        challenge = f'Bearer realm="{REALM}"'
        if exc.error:
            challenge += f', error="{exc.error}"'
        return {"WWW-Authenticate": challenge}
    if isinstance(exc, errors.Forbidden) and exc.scope:
        challenge = f'Bearer realm="{REALM}", error="insufficient_scope", scope="{exc.scope}"'
        return {"WWW-Authenticate": challenge}
    if exc.retry_after is not None:  # 429, and a 503 or 507 that knows when to come back
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    return {}


# ---------------------------------------------------------------------------------------------
# the Host allowlist


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """The Host names the server answers to: ``allowed_hosts`` plus the bind address (unless
    a wildcard); None when ``*`` allows any. Lower case, IPv6 without brackets."""
    names = {_name(h) for h in settings.allowed_hosts if h.strip()}
    if ANY_HOST in names:
        return None
    if settings.host not in ("", "0.0.0.0", "::"):
        names.add(_name(settings.host))
    return frozenset(names)


def _name(host: str) -> str:
    return host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


#: a Host header as RFC 9110 has it: a name, an IPv4 address or a bracketed IPv6 address, and
#: an optional port — nothing else (no userinfo, nothing after the bracket)
_HOST = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?"
)


def host_name(header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8765`` → ``::1``; "" for a
    header that is not a host and port (``[::1]evil.com``, ``127.0.0.1:80@evil.com``)."""
    found = _HOST.fullmatch(header.strip())
    if found is None:
        return ""
    return _name(found["v6"] or found["name"])


def _host_port(header: str) -> tuple[str, int | None] | None:
    found = _HOST.fullmatch(header.strip())
    if found is None:
        return None
    return _name(found["v6"] or found["name"]), int(found["port"]) if found["port"] else None


class HostAllowlist:
    """ASGI middleware: a request whose Host is not allowed gets a 400 problem document. A web
    page that rebinds its own DNS name to this server sends that name as Host, so it reads
    nothing (DNS rebinding)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed: Collection[str] | None,
        refuse: Callable[[errors.SgmeError], Response],
    ) -> None:
        self.app = app
        self.allowed = None if allowed is None else frozenset(allowed)
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed is None:
            await self.app(scope, receive, send)
            return
        raw = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host_name(raw) in self.allowed:
            await self.app(scope, receive, send)
            return
        refusal = errors.HostNotAllowed(
            f"this server does not answer to Host {raw!r}; an operator can add the name to "
            "allowed_hosts (SGME_ALLOWED_HOSTS)"
        )
        await self.refuse(refusal)(scope, receive, send)


# ---------------------------------------------------------------------------------------------
# cross-site requests and the bodies endpoints take

#: the methods that change something: a browser sends them across sites without asking first
#: when they look like a form (text/plain, form-encoded, multipart bodies)
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: what a request body must be, by path prefix (the first that matches); JSON everywhere else
BODY_TYPES: tuple[tuple[str, frozenset[str]], ...] = (
    ("/ui/", frozenset({"application/x-www-form-urlencoded"})),
)
JSON = frozenset({"application/json"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def allowed_origins(settings: Settings) -> frozenset[str]:
    """The ``allowed_origins`` setting, normalised (``scheme://host[:port]``, lower case, no
    default port): the origins whose pages may send state-changing requests."""
    found = set()
    for origin in settings.allowed_origins:
        normal = _origin(origin)
        if normal is None:
            raise errors.InvalidInput(
                f"setting allowed_origins: {origin!r} is not an origin (scheme://host[:port])"
            )
        found.add(normal)
    return frozenset(found)


def _origin(text: str) -> str | None:
    """``scheme://host[:port]`` in one spelling (lower case, no default port), or None."""
    scheme, sep, rest = text.strip().lower().partition("://")
    if not sep or scheme not in _DEFAULT_PORTS:
        return None
    parsed = _host_port(rest)
    if parsed is None:
        return None
    name, port = parsed
    host = f"[{name}]" if ":" in name else name
    return (
        f"{scheme}://{host}"
        if port in (None, _DEFAULT_PORTS[scheme])
        else f"{scheme}://{host}:{port}"
    )


def same_origin(origin: str, host_header: str) -> bool:
    """Whether ``origin`` names the server the request was sent to (its Host header), by
    name and port; the scheme is not compared, as a proxy may end TLS in front."""
    normal = _origin(origin)
    target = _host_port(host_header)
    if normal is None or target is None:
        return False
    scheme, _, rest = normal.partition("://")
    parsed = _host_port(rest)
    assert parsed is not None
    name, port = parsed
    return name == target[0] and (port or _DEFAULT_PORTS[scheme]) == (
        target[1] or _DEFAULT_PORTS[scheme]
    )


class SingleValuedQuery:
    """ASGI middleware: a query parameter of the API (``/v1/…``) given more than once is
    refused (422 ``invalid-input``). Every parameter of the API takes one value, and the
    framework would otherwise keep the last one silently (``?after=x&after=5``)."""

    def __init__(self, app: ASGIApp, refuse: Callable[[errors.SgmeError], Response]) -> None:
        self.app = app
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string", b"") if scope["type"] == "http" else b""
        if query and str(scope.get("path", "")).startswith("/v1/"):
            names = [name for name, _ in urllib.parse.parse_qsl(query.decode("latin-1"), True)]
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                refusal = errors.InvalidInput(
                    f"query parameter {repeated[0]!r} given more than once: it takes one value"
                )
                await self.refuse(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SameOrigin:
    """ASGI middleware for state-changing requests (``POST``, ``PUT``, ``PATCH``,
    ``DELETE``), with or without a token:

    * a browser's request from another site is refused (403 ``cross-site-request``): its
      ``Origin`` is neither this server nor an ``allowed_origins`` entry (``null`` included),
      or ``Sec-Fetch-Site`` says ``cross-site``/``same-site`` without such an origin;
    * a body whose ``Content-Type`` is not what its endpoint takes (:data:`BODY_TYPES`) is
      refused (415 ``unsupported-media-type``) before it is read.

    A web page can make a browser send a "simple" request — ``text/plain``, a form — to any
    address without a preflight, to a loopback server with no tokens included; these two
    checks keep such a page from writing into an agent's memory. Programs (no ``Origin``, no
    ``Sec-Fetch-Site``) send JSON as they always did."""

    def __init__(
        self,
        app: ASGIApp,
        allowed: Collection[str],
        refuse: Callable[[errors.SgmeError], Response],
    ) -> None:
        self.app = app
        self.allowed = frozenset(allowed)
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITES:
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is not None:
            await self.refuse(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> errors.SgmeError | None:
        """Why a state-changing request is refused, or None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        fetch_site = headers.get("sec-fetch-site", "").strip().lower()
        trusted = origin is not None and (
            same_origin(origin, headers.get("host", "")) or _origin(origin) in self.allowed
        )
        if (origin is not None and not trusted) or (
            fetch_site in ("cross-site", "same-site") and not trusted
        ):
            return errors.CrossSiteRequest(
                f"a state-changing request from another site (Origin {origin!r}, "
                f"Sec-Fetch-Site {fetch_site or 'absent'!r}) is refused; an operator can allow "
                "a web origin with allowed_origins (SGME_ALLOWED_ORIGINS)"
            )
        has_body = headers.get("content-length", "0").strip() not in ("", "0") or (
            "transfer-encoding" in headers
        )
        if not has_body:
            return None
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        path = str(scope.get("path", ""))
        wanted = next((types for prefix, types in BODY_TYPES if path.startswith(prefix)), JSON)
        if media not in wanted:
            return errors.UnsupportedMediaType(
                f"{path} takes a body of type {' or '.join(sorted(wanted))}, not "
                f"{media or 'one without a Content-Type'!r}"
            )
        return None


# ---------------------------------------------------------------------------------------------
# /openapi.json

_REASONS = {
    400: "the Host header is not in allowed_hosts",
    401: "no bearer token, or a malformed, unknown or revoked one (WWW-Authenticate: Bearer)",
    403: "the token lacks the scope this needs, or the agent_id of the body; or (any write) a "
    "browser's request from another site",
    415: "a request body that is not of the type the endpoint takes",
}


def document(schema: dict[str, Any], settings: Settings) -> None:
    """Add the answers of the checks above to every operation of ``schema``: 400 everywhere,
    401 and 403 wherever a bearer token is asked for (``/metrics`` only when protected)."""
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}

    def answer(status: int) -> dict[str, Any]:
        return {"description": _REASONS[status], "content": problem}

    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.setdefault("400", answer(400))
            if path == "/metrics" and settings.metrics_require_auth:
                operation["security"] = [{bearer.scheme_name: []}]
            if operation.get("security"):
                responses.setdefault("401", answer(401))
                responses.setdefault("403", answer(403))
            if method.upper() in WRITES:
                responses.setdefault("403", answer(403))
                responses.setdefault("415", answer(415))
