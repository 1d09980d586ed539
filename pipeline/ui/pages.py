"""The web view's pages: sessions, one session, search, status, and the token login.

Every page is read-only and server-rendered. A page reads through the
:class:`~pipeline.service.Service` with the viewer's agents, exactly as the API's routes do,
so a token sees here what it sees through ``/v1`` and nothing more. Page sizes and the login's
bounds are the ``ui_*`` settings (:class:`pipeline.settings.Ui`).

**Who is looking.** The token comes from the ``sgme_token`` cookie that the login form sets
(or an ``Authorization: Bearer`` header) and is checked by the API's own verifier. While auth
is off (no token made: loopback only) every page is open, as ``/v1`` is. Pages need the
``read`` scope; the status page ``admin`` (and it counts only that token's agents' files).

**The one write.** ``POST /ui/login`` (and ``/ui/logout``) change nothing but the cookie. They
take only a same-origin ``application/x-www-form-urlencoded`` body: the API's
:class:`~pipeline.api.security.SameOrigin` refuses a cross-site browser request (403) and any
other body type (415) before a page sees it, so another site cannot log a visitor in with a
token of its choosing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from pipeline import (
    auth,
    catalog,
    clock,
    document,
    errors,
    refs,
    search,
    sessions,
    tables,
    validation,
    vocabulary,
)
from pipeline.service import Service
from pipeline.settings import Ui
from pipeline.ui import render

router = APIRouter(include_in_schema=False)

COOKIE = "sgme_token"
ROLES = vocabulary.ROLES
SOURCES = vocabulary.SOURCE_TYPES

#: what the browser may load and run: this server's stylesheets, nothing else (no script, no
#: inline style, no frame, no form posted elsewhere)
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make a form's Origin "null"
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("pipeline.ui", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


class _LoginNeeded(Exception):
    """The page needs a token the request does not carry (or a valid one)."""


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def _ui(request: Request) -> Ui:
    return _service(request).settings.ui


def _secret(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.strip().partition(" ")
        return value.strip() if scheme.lower() == "bearer" else ""
    return request.cookies.get(COOKIE)


def _viewer(request: Request, scope: str = "read") -> auth.Caller:
    """Who is looking; :class:`_LoginNeeded` without a valid token while auth is on."""
    verifier: auth.Verifier = request.app.state.verifier
    try:
        caller = verifier.caller(_secret(request))
    except errors.Unauthorized:
        raise _LoginNeeded from None
    caller.require(scope)
    return caller


def _page(
    request: Request, template: str, *, status: int = 200, caller: auth.Caller | None, **values: Any
) -> HTMLResponse:
    body = _templates.get_template(template).render(
        path=request.url.path,
        signed_in=caller is not None and caller.token_id is not None,
        auth_on=request.app.state.verifier.enabled(),
        **values,
    )
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def _refused(request: Request, exc: errors.SgmeError, caller: auth.Caller | None) -> Response:
    if isinstance(exc, errors.Unauthorized):
        return _to_login(request)
    return _page(
        request, "error.html", status=exc.status, caller=caller, status_code=exc.status,
        title=type(exc).__name__, detail=exc.detail,
    )  # fmt: skip


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        f"/ui/login?{urlencode({'next': target})}", status_code=303, headers=HEADERS
    )


def _view(request: Request, scope: str, build: Any) -> Response:
    """Run ``build(caller)`` for the viewer, answering a login redirect or an error page."""
    try:
        caller = _viewer(request, scope)
    except _LoginNeeded:
        return _to_login(request)
    except errors.SgmeError as exc:
        return _refused(request, exc, None)
    try:
        response: Response = build(caller)
    except errors.SgmeError as exc:
        return _refused(request, exc, caller)
    return response


# ---------------------------------------------------------------------------------------------
# parameters (read leniently: a bad value is a 400 page that names it)


def _text(params: Mapping[str, str], name: str, limit: int = 1000) -> str | None:
    value = params.get(name, "").strip()
    if not value:
        return None
    if len(value) > limit or "\x00" in value:
        raise errors.InvalidInput(f"{name}: at most {limit} characters, no NUL")
    return value


def _choice(params: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    value = _text(params, name)
    if value is not None and value not in allowed:
        raise errors.InvalidInput(f"{name}: one of {', '.join(allowed)}, got {value!r}")
    return value


def _agent(params: Mapping[str, str]) -> str | None:
    value = _text(params, "agent_id", 64)
    if value is not None:
        validation.check_agent_id(value)
    return value


def _int(params: Mapping[str, str], name: str, *, default: int, high: int) -> int:
    raw = params.get(name, "").strip()
    if not raw:
        return default
    if not raw.isascii() or not raw.isdigit() or int(raw) > high:
        raise errors.InvalidInput(f"{name}: a whole number 0..{high}, got {raw[:40]!r}")
    return int(raw)


def _time(params: Mapping[str, str], name: str, *, end_of_day: bool) -> dt.datetime | None:
    """A date (the day's start, or its end for ``until``) or a date and time; naive UTC."""
    raw = _text(params, name, 40)
    if raw is None:
        return None
    try:
        if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", raw):
            day = dt.datetime.combine(dt.date.fromisoformat(raw), dt.time())
            return day + dt.timedelta(days=1, microseconds=-1) if end_of_day else day
        when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise errors.InvalidInput(f"{name}: a date (YYYY-MM-DD) or a time, got {raw!r}") from None
    return clock.naive_utc(when)


def message_url(file_id: str, seq: int, *, page: int) -> str:
    """The page of a session (``page`` messages a page) that shows message ``seq``, at its
    anchor."""
    after = (seq - 1) // page * page
    query = f"?after={after}" if after else ""
    return f"/ui/files/{file_id}{query}#seq-{seq}"


def when(ts: str) -> str:
    """A stored time for a person: ``2026-08-03 11:18:06`` (UTC, to the second)."""
    return ts.replace("T", " ")[:19]


_templates.filters["when"] = when
_templates.globals["span"] = sessions.span


# ---------------------------------------------------------------------------------------------
# pages


@router.get("/ui")
def list_sessions(request: Request) -> Response:
    """Sessions newest first, filtered and paged."""
    service = _service(request)
    params = request.query_params
    size = _ui(request).page_sessions

    def build(caller: auth.Caller) -> Response:
        agent_id = _agent(params)
        source = _choice(params, "source_type", SOURCES)
        filters = sessions.Filters(
            agents=caller.listing(agent_id),
            source_type=source,
            since=_time(params, "since", end_of_day=False),
            until=_time(params, "until", end_of_day=True),
        )
        offset = _int(params, "offset", default=0, high=sessions.MAX_OFFSET)
        page = service.browsing.list_sessions(filters, offset=offset, limit=size)
        kept = {k: v for k, v in params.items() if k != "offset" and v}

        def at(offset: int) -> str:
            return "/ui?" + urlencode({**kept, "offset": offset})

        earlier = at(page.next_offset) if page.next_offset is not None else None
        later = at(max(0, offset - size)) if offset > 0 else None
        return _page(
            request, "sessions.html", caller=caller, page=page, form=dict(params),
            sources=SOURCES, earlier=earlier, later=later,
        )  # fmt: skip

    return _view(request, "read", build)


@router.get("/ui/files/{file_id}")
def show_session(request: Request, file_id: str) -> Response:
    """One session as a conversation, a page of messages at a time, with its L1 items."""
    service = _service(request)
    params = request.query_params
    ui = _ui(request)
    size = ui.page_messages

    def build(caller: auth.Caller) -> Response:
        session = service.browsing.get_session(file_id, agents=caller.agents)
        row = session.file
        after = _int(params, "after", default=0, high=refs.MAX_SEQ)
        found = service.messages(file_id, after_seq=after, limit=size, agents=caller.agents)
        budget = render.Budget(ui.render_page_marks)
        shown = [render.show(m, file_id, chars=ui.render_chars, budget=budget) for m in found]
        last = found[-1].seq if found else after
        items = service.l1_items(file_id=file_id, agents=caller.agents, limit=ui.page_items)
        return _page(
            request, "session.html", caller=caller, file=row, session=session,
            messages=shown, items=[_item(i, size) for i in items], plain=budget.ran_out,
            earlier=f"/ui/files/{file_id}?after={max(0, after - size)}" if after else None,
            later=f"/ui/files/{file_id}?after={last}" if last < row.flushed_seq else None,
        )  # fmt: skip

    return _view(request, "read", build)


@dataclasses.dataclass(frozen=True)
class _Item:
    kind: str
    content: str
    refs: list[tuple[str, str]]  #: (source_ref, the page's URL of it)


def _item(item: tables.L1Item, page: int) -> _Item:
    links = []
    for ref in item.to_json()["source_refs"]:
        try:
            file_id, seq = refs.parse(ref)
        except errors.InvalidInput:
            continue
        links.append((ref, message_url(file_id, seq, page=page)))
    return _Item(kind=item.kind, content=item.content, refs=links)


@dataclasses.dataclass(frozen=True)
class _Hit:
    hit: search.Result
    url: str
    before: str | None
    after: str | None


def _opened(service: Service, ui: Ui, caller: auth.Caller, ref: str) -> Response:
    """Go to the page of a session that holds the message ``ref`` names, at it; an error
    page (422, 404, 410) when it names none the caller may read."""
    found = service.resolve(ref, context=0, agents=caller.agents)
    url = message_url(found.file.file_id, found.message.seq, page=ui.page_messages)
    return RedirectResponse(url, status_code=303, headers=HEADERS)


@router.get("/ui/refs/{ref}")
def open_ref(request: Request, ref: str) -> Response:
    """The message a ``file_id:seq`` names, on its session's page."""
    service = _service(request)
    ui = _ui(request)

    def build(caller: auth.Caller) -> Response:
        refs.parse(ref)  # what is wrong with one that is not a source_ref, in words
        return _opened(service, ui, caller, ref)

    return _view(request, "read", build)


_PASTED = re.compile(r"\s*\[?\s*([^\s\[\]]+)\s*\]?\s*")


@router.get("/ui/search")
def search_page(request: Request) -> Response:
    """The search box, and the hits of a query in context. A ``file_id:seq`` typed or pasted
    into it (brackets and all, as a recall line shows it) opens that message; a file_id, its
    session."""
    service = _service(request)
    params = request.query_params
    ui = _ui(request)

    def build(caller: auth.Caller) -> Response:
        q = _text(params, "q")
        pasted = _PASTED.fullmatch(q or "")
        if pasted and re.fullmatch(refs.SOURCE_REF_PATTERN, pasted[1]):
            return _opened(service, ui, caller, pasted[1])
        if pasted and re.fullmatch(refs.FILE_ID_PATTERN, pasted[1]):
            service.get_file(pasted[1], agents=caller.agents)  # 404 unless the caller's
            return RedirectResponse(f"/ui/files/{pasted[1]}", status_code=303, headers=HEADERS)
        hits: list[_Hit] = []
        if q is not None:
            filters = catalog.Filters(
                agents=caller.agents,
                agent_id=_agent(params),
                role=_choice(params, "role", ROLES),
                since=_time(params, "since", end_of_day=False),
                until=_time(params, "until", end_of_day=True),
            )
            # a date the query names is a window, as GET /v1/search makes it (docs/search.md)
            found = service.search(q, filters, limit=ui.page_hits, window=service.window(q))
            hits = [_in_context(service, ui, caller, h) for h in found]
        return _page(
            request, "search.html", caller=caller, q=q or "", hits=hits, form=dict(params),
            roles=ROLES,
        )  # fmt: skip

    return _view(request, "read", build)


def _in_context(service: Service, ui: Ui, caller: auth.Caller, hit: search.Result) -> _Hit:
    """A hit with the ends of the messages around it (none when they cannot be read)."""
    before = after = None
    try:
        found = service.resolve(
            hit.source_ref, context=1, max_bytes=ui.context_bytes, agents=caller.agents
        )
    except errors.SgmeError:
        found = None
    if found is not None and found.before:
        before = _excerpt(found.before[-1], ui.context_chars)
    if found is not None and found.after:
        after = _excerpt(found.after[0], ui.context_chars)
    return _Hit(hit, message_url(hit.file_id, hit.seq, page=ui.page_messages), before, after)


def _excerpt(message: document.Message, chars: int) -> str:
    kind, name, text = render.classify(message)
    label = f"{message.role}" + (f" · {kind} {name}" if name else "")
    return f"{label}: {sessions.shorten(text, words=60, chars=chars)}"


@router.get("/ui/status")
def status_page(request: Request) -> Response:
    """Backlog, refinement lag, files by status and the latest anomalies: of the admin
    token's agents only (all of them for a token of every agent)."""
    service = _service(request)
    shown = _ui(request).status_anomalies

    def build(caller: auth.Caller) -> Response:
        found = service.browsing.store_overview(anomalies=shown, agents=caller.agents)
        behind = service.hybrid.embedding_lag(agents=caller.agents)
        return _page(
            request, "status.html", caller=caller, o=found, now=found.at, embedding_lag=behind
        )

    return _view(request, "admin", build)


# ---------------------------------------------------------------------------------------------
# the token login: the only POSTs, and they change nothing but the cookie


def _next(value: str | None) -> str:
    """Where to go after login: a page of this view, never another site."""
    if value and value.startswith("/ui") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ui"


@router.get("/ui/login")
def login_form(request: Request) -> Response:
    """The form that takes a token."""
    return _page(
        request, "login.html", caller=None, next=_next(request.query_params.get("next")),
        error=None,
    )  # fmt: skip


async def _form(request: Request) -> dict[str, str]:
    """The form's fields: a small ``application/x-www-form-urlencoded`` body, from this site
    (:class:`~pipeline.api.security.SameOrigin` refused any other before this is called)."""
    most = _ui(request).max_form_bytes
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > most:
            raise errors.RequestTooLarge(f"a login form is at most {most} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=10, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise errors.InvalidInput("the form is not UTF-8 form data") from None
    return {name: values[0] for name, values in fields.items()}


@router.post("/ui/login")
async def login(request: Request) -> Response:
    """Check the token and keep it in an HttpOnly, SameSite=Strict cookie (Secure over
    https); then go where the login was asked from."""
    try:
        form = await _form(request)
    except errors.SgmeError as exc:
        return _refused(request, exc, None)
    target = _next(form.get("next"))
    secret = form.get("token", "").strip()
    verifier: auth.Verifier = request.app.state.verifier
    try:
        caller = await run_in_threadpool(verifier.caller, secret, required=True)
        caller.require("read")
    except errors.SgmeError as exc:
        why = "unknown, revoked or malformed token" if exc.status == 401 else exc.detail
        return _page(request, "login.html", status=exc.status, caller=None, next=target, error=why)
    response = RedirectResponse(target, status_code=303, headers=HEADERS)
    response.set_cookie(
        COOKIE,
        secret,
        max_age=_ui(request).login_seconds,
        path="/ui",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    del caller
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    """Forget the cookie."""
    try:
        await _form(request)
    except errors.SgmeError as exc:
        return _refused(request, exc, None)
    response = RedirectResponse("/ui/login", status_code=303, headers=HEADERS)
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response


# ---------------------------------------------------------------------------------------------
# the stylesheets (package data; the highlighting's generated once)

_ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#2457a6"/></svg>'
)


def _packaged(name: str) -> Callable[[], str]:
    def read() -> str:
        return resources.files("pipeline.ui").joinpath("static", name).read_text("utf-8")

    return read


_STATIC: dict[str, Callable[[], str]] = {
    "ui.css": _packaged("ui.css"),
    "pygments.css": render.pygments_css,
    "icon.svg": lambda: _ICON,
}
_TYPES = {".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_CACHED: dict[str, str] = {}


@router.get("/ui/static/{name}")
def static(name: str) -> Response:
    """A stylesheet (or the icon) of the view."""
    if name not in _STATIC:
        return Response("not found", status_code=404, media_type="text/plain", headers=HEADERS)
    if name not in _CACHED:
        _CACHED[name] = _STATIC[name]()
    headers = {**HEADERS, "Cache-Control": "public, max-age=3600"}
    kind = _TYPES[name[name.rindex(".") :]]
    return Response(_CACHED[name], media_type=kind, headers=headers)
