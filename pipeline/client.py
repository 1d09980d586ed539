"""A client for the SGME L0 HTTP API (httpx): :class:`Client` blocks, :class:`AsyncClient`
awaits; both offer the same operations with the same arguments and answers.

    from pipeline import client

    with client.Client("http://127.0.0.1:8765", token="sgme_…") as sgme:
        ack = sgme.append(agent_id="hermes", session_key="s1",
                          messages=[{"role": "user", "content": "I prefer green tea."}])
        for message in sgme.iter_messages(ack.file_id):
            print(message.source_ref, message.content)

**Answers** are the API's own response models (:mod:`pipeline.api.models`): ``append`` gives
an ``Appended``, ``files`` a ``Files`` page, ``raw`` the file's bytes, ``search`` the ``Hits``
best first, and so on.

**Retries.** A call is tried again when the server says it cannot take it now (503, 507, 429,
and a proxy's 502 or 504 for calls that are safe to repeat) or the connection fails, waiting
``Retry-After`` when the answer has one and an exponential backoff with jitter otherwise, at
most :attr:`Retry.attempts` times within :attr:`Retry.deadline` seconds. An append or upload
always carries an ``idempotency_key`` (one is made when the caller gives none) and every try
sends the same one, so a retry after a lost answer writes nothing twice. A ``Retry-After``
longer than what is left of the deadline ends the call at once.

**Errors** are :mod:`pipeline.errors` classes, chosen by the problem document's ``type``
(``urn:sgme:problem:not-found`` → :class:`~pipeline.errors.NotFound`), each with the server's
``detail``, the answer's ``status`` and ``retry_after``; an answer that is no problem document
gets the class of its status, and a server that never answered
:class:`~pipeline.errors.Unreachable`.

How it is built: every operation is declared once, as an :class:`Endpoint` whose builder turns
the caller's arguments into an :class:`exchange.Call` (the request, and how to read its
answer). Read on a :class:`Client` it is a method that returns the answer; on an
:class:`AsyncClient`, one that returns an awaitable of it. Whether an outcome is the answer, an
error, or worth another try (and after how long) is decided by :class:`exchange.Attempts`,
which does no I/O; the two clients only send requests and sleep.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload
from urllib.parse import quote

import httpx
import pydantic

from pipeline import answers, document, errors, exchange, vocabulary

P = ParamSpec("P")
T = TypeVar("T")
Item = TypeVar("Item")
Transport = TypeVar("Transport", httpx.BaseTransport, httpx.AsyncBaseTransport)

DEFAULT_TIMEOUT = 10.0  #: seconds to connect, and for each read or write of one request
DEFAULT_PAGE_SIZE = 100  #: items per page the ``iter_*`` helpers ask for (the API takes ≤ 1000)
DEFAULT_SEARCH_LIMIT = 20  #: hits ``search`` asks for (the API takes ≤ 100)
DEFAULT_SESSIONS = 20  #: sessions ``sessions`` asks for (the API takes ≤ 200)
USER_AGENT = "sgme-client/0.1.0"
# The retry policies, for ``Client(…, retry=…)`` (they live with the retry logic).
Retry = exchange.Retry
DEFAULT_RETRY = exchange.DEFAULT_RETRY
NO_RETRY = exchange.NO_RETRY

# ---------------------------------------------------------------------------------------------
# the operations, declared once for both clients


class _Declared(Generic[P, T]):
    """An operation declared once: ``build`` turns the caller's arguments into what a client
    runs (an :class:`exchange.Call`, or the :class:`exchange.Pages` of a listing)."""

    def __init__(self, build: Callable[P, T]) -> None:
        self.build = build
        self.name = build.__name__.lstrip("_")
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    def _bind(self, client: Client | AsyncClient, run: Callable[[T], Any]) -> Any:
        """The method ``client.<name>``: build, then ``run`` what was built."""
        build = self.build

        @functools.wraps(build)
        def method(*args: P.args, **kwargs: P.kwargs) -> Any:
            return run(build(*args, **kwargs))

        method.__name__ = self.name
        method.__qualname__ = f"{type(client).__name__}.{self.name}"
        return method


class Endpoint(_Declared[P, exchange.Call[T]]):
    """An operation: on a :class:`Client` a method answering ``T``, on an
    :class:`AsyncClient` a coroutine function answering ``T``."""

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Endpoint[P, T]: ...
    @overload
    def __get__(self, client: Client, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(self, client: AsyncClient, owner: type[Any]) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, client: Client | AsyncClient | None, owner: type[Any]) -> Any:
        return self if client is None else self._bind(client, client._call)


class Paged(_Declared[P, exchange.Pages[Any, Item]]):
    """A listing walked to its end: on a :class:`Client` a method answering an iterator of
    its items, on an :class:`AsyncClient` one answering an async iterator."""

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Paged[P, Item]: ...
    @overload
    def __get__(self, client: Client, owner: type[Any]) -> Callable[P, Iterator[Item]]: ...
    @overload
    def __get__(
        self, client: AsyncClient, owner: type[Any]
    ) -> Callable[P, AsyncIterator[Item]]: ...
    def __get__(self, client: Client | AsyncClient | None, owner: type[Any]) -> Any:
        return self if client is None else self._bind(client, client._walk)


def _key(given: str | None) -> str:
    """The caller's idempotency key, or a new one: made once per call, so that every try of
    it sends the same key."""
    return given if given is not None else f"client:{uuid.uuid4().hex}"


def _id(value: str) -> str:
    """A path segment: whatever it holds stays one segment (the server validates it)."""
    return quote(value, safe="")


def _query(**params: str | int | None) -> dict[str, str | int]:
    return {name: value for name, value in params.items() if value is not None}


def _append(
    *,
    agent_id: str,
    session_key: str,
    messages: Sequence[Mapping[str, Any]],
    source_type: str = "session",
    metadata: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    wait: bool = False,
    sequence: int | None = None,
    legacy_key: str | None = None,
) -> exchange.Call[answers.Appended]:
    """Append ``messages`` (``{"role", "content", "ts"?, "tool_name"?}``) to a session; with
    ``wait`` the answer comes once they are in the file. Retried with the same
    ``idempotency_key`` (a new one unless given), so it is written once.

    ``sequence`` numbers the session's appends (1, 2, …; a session uses them always or
    never): one that is not the next the session expects raises
    :class:`~pipeline.errors.OutOfOrder` (never retried), whose ``expected`` is that one.
    ``legacy_key``: the key an earlier version of the caller gave the turn these messages
    belong to (when it is recorded, nothing is written)."""
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "session_key": session_key,
        "source_type": source_type,
        "idempotency_key": _key(idempotency_key),
        "messages": [dict(m) for m in messages],
    }
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if sequence is not None:
        body["sequence"] = sequence
    if legacy_key is not None:
        body["legacy_key"] = legacy_key
    params = _query(wait="flushed" if wait else None)
    return exchange.Call(
        "POST", "/v1/append", exchange.model_reader(answers.Appended), params, body
    )


def _upload(
    *,
    agent_id: str,
    filename: str,
    content: str,
    metadata: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> exchange.Call[answers.Uploaded]:
    """Store one UTF-8 text document as a file of its own (retried like an append)."""
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "filename": filename,
        "content": content,
        "idempotency_key": _key(idempotency_key),
    }
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return exchange.Call("POST", "/v1/uploads", exchange.model_reader(answers.Uploaded), body=body)


def _files(
    *,
    agent_id: str | None = None,
    status: str | None = None,
    source_type: str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
) -> exchange.Call[answers.Files]:
    """One page of files, ordered by file_id; ``next_cursor`` asks for the next."""
    params = _query(
        agent_id=agent_id, status=status, source_type=source_type, limit=limit, cursor=cursor
    )
    return exchange.Call("GET", "/v1/files", exchange.model_reader(answers.Files), params)


def _iter_files(
    *,
    agent_id: str | None = None,
    status: str | None = None,
    source_type: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> exchange.Pages[answers.Files, answers.File]:
    """Every file (that the token may see), page by page."""

    def page(cursor: str | None) -> exchange.Call[answers.Files]:
        return _files(
            agent_id=agent_id,
            status=status,
            source_type=source_type,
            limit=page_size,
            cursor=cursor,
        )

    def following(found: answers.Files) -> exchange.Call[answers.Files] | None:
        return None if found.next_cursor is None else page(found.next_cursor)

    return exchange.Pages(page(None), lambda found: found.files, following)


def _sessions(
    *,
    agent_id: str | None = None,
    source_type: str | None = None,
    since: dt.datetime | str | None = None,
    until: dt.datetime | str | None = None,
    limit: int = DEFAULT_SESSIONS,
    offset: int = 0,
) -> exchange.Call[answers.Sessions]:
    """One page of sessions, newest first, each with its title, time span and message count;
    ``total`` counts all that match, ``next_offset`` asks for the next page. ``since`` keeps
    sessions active at or after it, ``until`` those begun at or before it."""
    params = _query(
        agent_id=agent_id,
        source_type=source_type,
        since=_time(since),
        until=_time(until),
        limit=limit,
        offset=offset,
    )
    return exchange.Call("GET", "/v1/sessions", exchange.model_reader(answers.Sessions), params)


def _file(file_id: str) -> exchange.Call[answers.File]:
    """A file's index row."""
    return exchange.Call("GET", f"/v1/files/{_id(file_id)}", exchange.model_reader(answers.File))


def _raw(file_id: str) -> exchange.Call[bytes]:
    """The file's committed bytes, exactly as on disk (decompressed if archived)."""
    return exchange.Call("GET", f"/v1/files/{_id(file_id)}/raw", exchange.read_bytes)


def _messages(
    file_id: str, *, after_seq: int = 0, limit: int = DEFAULT_PAGE_SIZE
) -> exchange.Call[answers.Messages]:
    """One page of a file's flushed messages with ``seq > after_seq``."""
    params = _query(after_seq=after_seq, limit=limit)
    return exchange.Call(
        "GET", f"/v1/files/{_id(file_id)}/messages", exchange.model_reader(answers.Messages), params
    )


def _iter_messages(
    file_id: str, *, after_seq: int = 0, page_size: int = DEFAULT_PAGE_SIZE
) -> exchange.Pages[answers.Messages, answers.Message]:
    """Every flushed message of a file after ``after_seq``, in order, page by page (a page
    may be shorter than ``page_size``: an empty one ends the file)."""

    def following(page: answers.Messages) -> exchange.Call[answers.Messages] | None:
        if not page.messages or page.next_after_seq is None:
            return None
        return _messages(file_id, after_seq=page.next_after_seq, limit=page_size)

    first = _messages(file_id, after_seq=after_seq, limit=page_size)
    return exchange.Pages(first, lambda page: page.messages, following)


def _ref(source_ref: str, *, context: int = 1) -> exchange.Call[answers.Ref]:
    """The message a source_ref (``file_id:seq``) names, with ``context`` neighbours a side."""
    path = f"/v1/refs/{quote(source_ref, safe=':')}"
    return exchange.Call("GET", path, exchange.model_reader(answers.Ref), _query(context=context))


def _l1(
    *,
    file_id: str | None = None,
    agent_id: str | None = None,
    after: int = 0,
    limit: int = DEFAULT_PAGE_SIZE,
) -> exchange.Call[answers.L1Items]:
    """One page of L1 items, oldest first; ``next_after`` asks for the next."""
    params = _query(file_id=file_id, agent_id=agent_id, after=after, limit=limit)
    return exchange.Call("GET", "/v1/l1", exchange.model_reader(answers.L1Items), params)


def _iter_l1(
    *,
    file_id: str | None = None,
    agent_id: str | None = None,
    after: int = 0,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> exchange.Pages[answers.L1Items, answers.L1Item]:
    """Every L1 item after ``after``, oldest first, page by page."""

    def following(page: answers.L1Items) -> exchange.Call[answers.L1Items] | None:
        if page.next_after is None:
            return None
        return _l1(file_id=file_id, agent_id=agent_id, after=page.next_after, limit=page_size)

    first = _l1(file_id=file_id, agent_id=agent_id, after=after, limit=page_size)
    return exchange.Pages(first, lambda page: page.items, following)


#: the file's row, or (a token that may not read it) that the re-refine was requested
_refined = exchange.shape_reader(
    pydantic.TypeAdapter(answers.File | answers.RefineRequested).validate_json,
    "a File or a RefineRequested",
)


def _refine(file_id: str) -> exchange.Call[answers.File | answers.RefineRequested]:
    """Ask for a full re-refine of a file (its L1 items are replaced when the run commits).
    :class:`~pipeline.errors.Throttled` (429) during the file's cooldown."""
    # Not repeatable: were an answer lost, a second request would meet the first's cooldown.
    return exchange.Call(
        "POST",
        f"/v1/files/{_id(file_id)}/refine",
        _refined,
        repeatable=False,
    )


def _redact(source_ref: str, *, reason: str) -> exchange.Call[answers.Redacted]:
    """Redact the message a source_ref names (an ``admin`` token): its body becomes a
    tombstone naming when and why. Redacting it again changes nothing, so it is retried."""
    path = f"/v1/refs/{quote(source_ref, safe=':')}/redact"
    body = {"reason": reason}
    return exchange.Call("POST", path, exchange.model_reader(answers.Redacted), body=body)


def _erase(file_id: str, *, reason: str | None = None) -> exchange.Call[None]:
    """Erase a file and everything derived from it (an ``admin`` token); afterwards it
    answers :class:`~pipeline.errors.Gone`."""
    # Not repeatable: were the answer lost, a second request would be told 410 Gone.
    return exchange.Call(
        "DELETE",
        f"/v1/files/{_id(file_id)}",
        lambda response: None,
        _query(reason=reason),
        repeatable=False,
    )


def _audit(
    *, file_id: str | None = None, after: int = 0, limit: int = DEFAULT_PAGE_SIZE
) -> exchange.Call[answers.AuditRecords]:
    """One page of the audit trail of redactions and erasures (an ``admin`` token)."""
    params = _query(file_id=file_id, after=after, limit=limit)
    return exchange.Call("GET", "/v1/audit", exchange.model_reader(answers.AuditRecords), params)


def _health() -> exchange.Call[answers.Health]:
    """Whether the index answers and the data directory is writable (a degraded server's
    answer is returned, not raised)."""
    return exchange.Call(
        "GET", "/v1/health", exchange.model_reader(answers.Health), accept=frozenset({200, 503})
    )


def _search(
    query: str,
    *,
    agent_id: str | None = None,
    session_key: str | None = None,
    file_id: str | None = None,
    role: str | None = None,
    since: dt.datetime | str | None = None,
    until: dt.datetime | str | None = None,
    limit: int = DEFAULT_SEARCH_LIMIT,
    match: str = "any",
    context: int = 0,
    ref_time: dt.datetime | str | None = None,
    speaker: str | None = None,
    mode: vocabulary.SearchMode | None = None,
) -> exchange.Call[answers.Hits]:
    """The messages that best match ``query`` (sent as ``q``: a question, words and
    ``"quoted phrases"``; any language), best first, each with its ``source_ref`` and a
    snippet. ``match="any"`` ranks by relevance (docs/search.md); ``match="all"`` finds only
    messages holding every word and phrase. The filters combine; ``since`` and ``until`` are
    datetimes (naive ones are UTC) or RFC 3339 text. Only the token's agents are searched.
    ``context`` (0-3): each hit comes with that many turns before and after it. A date the
    question names is resolved against ``ref_time`` (default: now): the answer's ``window``.
    ``speaker``: only what that speaker said (docs/search.md, "Speakers"). ``mode``:
    ``"lexical"`` ranks by words only, ``"hybrid"`` fuses words with meaning (a server without
    ``search_embedder`` ranks by words and says so); default: hybrid when the server has an
    embedder. The answer's
    ``ranking`` says how it was ranked (docs/search.md, "Semantic search")."""
    params = _query(
        q=query,
        match=match,
        agent_id=agent_id,
        session_key=session_key,
        file_id=file_id,
        role=role,
        since=_time(since),
        until=_time(until),
        limit=limit,
        context=context or None,
        ref_time=_time(ref_time),
        speaker=speaker,
        mode=mode,
    )
    return exchange.Call("GET", "/v1/search", exchange.model_reader(answers.Hits), params)


def _time(value: dt.datetime | str | None) -> str | None:
    """A time parameter as RFC 3339 text (a naive datetime is UTC)."""
    return document.format_ts(value) if isinstance(value, dt.datetime) else value


class Operations(Generic[Transport]):
    """What both clients share: the operations, and the settings every call uses.

    ``base_url`` is the server (``http://127.0.0.1:8765``); ``token`` is sent as
    ``Authorization: Bearer``; ``timeout`` bounds connecting and each read or write of one
    request, in seconds; ``retry`` says how often and how long a call is tried;
    ``transport`` replaces httpx's (tests pass an ``httpx.MockTransport``)."""

    append = Endpoint(_append)
    upload = Endpoint(_upload)
    files = Endpoint(_files)
    iter_files = Paged(_iter_files)
    sessions = Endpoint(_sessions)
    file = Endpoint(_file)
    raw = Endpoint(_raw)
    messages = Endpoint(_messages)
    iter_messages = Paged(_iter_messages)
    ref = Endpoint(_ref)
    l1 = Endpoint(_l1)
    iter_l1 = Paged(_iter_l1)
    refine = Endpoint(_refine)
    redact = Endpoint(_redact)
    erase = Endpoint(_erase)
    audit = Endpoint(_audit)
    health = Endpoint(_health)
    search = Endpoint(_search)  # one page: the best ``limit`` hits (at most 100), no cursor

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        retry: exchange.Retry = exchange.DEFAULT_RETRY,
        transport: Transport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise errors.InvalidInput(
                f"base_url must start with http:// or https://, not {base_url!r}"
            )
        self.base_url = base_url
        self.retry = retry
        headers = {"User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            self._open(
                transport, base_url=base_url, headers=headers, timeout=httpx.Timeout(timeout)
            )
        except httpx.InvalidURL as exc:
            raise errors.InvalidInput(f"bad base_url {base_url!r}: {exc}") from None

    def _open(self, transport: Transport | None, **options: Any) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"


def _request(call: exchange.Call[Any], http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
    """The request of ``call``; one that cannot be made (a URL past what httpx takes, 64 KiB:
    a parameter too long for any route) is :class:`errors.InvalidInput`."""
    try:
        return call.request(http)
    except httpx.InvalidURL as exc:
        raise errors.InvalidInput(f"the request cannot be sent: {exc}") from None


class Client(Operations[httpx.BaseTransport]):
    """The blocking client; use it in a ``with`` block, or :meth:`close` it."""

    def _open(self, transport: httpx.BaseTransport | None, **options: Any) -> None:
        self._http = httpx.Client(transport=transport, **options)

    def _call(self, call: exchange.Call[T]) -> T:
        """Send ``call`` until it is answered or :class:`exchange.Attempts` gives up."""
        attempts = exchange.Attempts(call, self.retry)
        while True:
            done = attempts.settle(self._send(call))
            if isinstance(done, httpx.Response):
                return call.read(done)
            time.sleep(done)

    def _send(self, call: exchange.Call[Any]) -> httpx.Response | httpx.RequestError:
        try:
            return self._http.send(_request(call, self._http))
        except httpx.RequestError as exc:
            return exc

    def _walk(self, pages: exchange.Pages[Any, Item]) -> Iterator[Item]:
        call: exchange.Call[Any] | None = pages.first
        while call is not None:
            page = self._call(call)
            yield from pages.items(page)
            call = pages.following(page)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClient(Operations[httpx.AsyncBaseTransport]):
    """The asyncio client; use it in an ``async with`` block, or :meth:`aclose` it. Each
    operation is a coroutine function (``await sgme.append(…)``); the ``iter_*`` helpers are
    async iterators (``async for message in sgme.iter_messages(file_id)``)."""

    def _open(self, transport: httpx.AsyncBaseTransport | None, **options: Any) -> None:
        self._http = httpx.AsyncClient(transport=transport, **options)

    async def _call(self, call: exchange.Call[T]) -> T:
        """Send ``call`` until it is answered or :class:`exchange.Attempts` gives up."""
        attempts = exchange.Attempts(call, self.retry)
        while True:
            done = attempts.settle(await self._send(call))
            if isinstance(done, httpx.Response):
                return call.read(done)
            await asyncio.sleep(done)

    async def _send(self, call: exchange.Call[Any]) -> httpx.Response | httpx.RequestError:
        try:
            return await self._http.send(_request(call, self._http))
        except httpx.RequestError as exc:
            return exc

    async def _walk(self, pages: exchange.Pages[Any, Item]) -> AsyncIterator[Item]:
        call: exchange.Call[Any] | None = pages.first
        while call is not None:
            page = await self._call(call)
            for item in pages.items(page):
                yield item
            call = pages.following(page)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
