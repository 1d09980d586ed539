"""The client's request/answer logic (:mod:`pipeline.exchange`, driven through
:mod:`pipeline.client`) without a server (``httpx.MockTransport``): retries reuse the
idempotency key and stop at the limit or the deadline, only safe calls are repeated after a
lost answer, every problem type becomes its own error class, and the sync and async clients
behave the same. ``tests/e2e/test_client.py`` runs the client against a real ``sgme serve``."""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pipeline import client, errors, exchange
from pipeline.api import models

FILE_ID = str(uuid.UUID(int=1, version=4))
FAST = client.Retry(attempts=4, deadline=10.0, backoff=0.001, max_backoff=0.001)
ACK = {
    "file_id": FILE_ID,
    "first_seq": 1,
    "last_seq": 1,
    "source_refs": [f"{FILE_ID}:1"],
    "status": "pending",
}
MESSAGE = {"role": "user", "content": "I prefer green tea."}

Handler = Callable[[httpx.Request], httpx.Response]


def problem(status: int, kind: str, detail: str = "refused", **headers: str) -> httpx.Response:
    """A problem+json answer; header names are given with ``_`` for ``-`` (``retry_after``)."""
    body = {"type": errors.problem_type(kind), "title": kind, "status": status, "detail": detail}
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return httpx.Response(
        status,
        content=json.dumps(body).encode(),
        headers={"content-type": "application/problem+json", **named},
    )


class Server:
    """A scripted server: answers in order (a Response, or an exception to raise), and every
    request it saw."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.content]

    def sync(self, retry: client.Retry = FAST) -> client.Client:
        return client.Client("http://sgme.test", "sgme_t", retry=retry, transport=self.transport())

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def append(sgme: client.Client, **extra: Any) -> Any:
    return sgme.append(agent_id="a", session_key="s", messages=[MESSAGE], **extra)


# ---------------------------------------------------------------------------------------------
# retries


def test_a_503_is_retried_with_the_same_generated_key_and_the_answer_is_typed() -> None:
    server = Server(
        problem(503, "index-unavailable", "index database stayed locked for 30 s"),
        problem(503, "overloaded", retry_after="0"),
        httpx.Response(202, json=ACK),
    )
    with server.sync() as sgme:
        ack = append(sgme)
    assert ack.file_id == FILE_ID and ack.source_refs == [f"{FILE_ID}:1"]
    bodies = server.bodies()
    assert len(bodies) == 3
    keys = {body["idempotency_key"] for body in bodies}
    assert len(keys) == 1 and next(iter(keys)).startswith("client:")
    assert all(body == bodies[0] for body in bodies)
    assert server.requests[0].headers["authorization"] == "Bearer sgme_t"
    assert server.requests[0].headers["content-type"] == "application/json"


def test_a_given_key_is_sent_as_is_and_each_call_gets_its_own_generated_key() -> None:
    server = Server(*(httpx.Response(202, json=ACK) for _ in range(3)))
    with server.sync() as sgme:
        append(sgme, idempotency_key="mine-1")
        append(sgme)
        append(sgme)
    keys = [body["idempotency_key"] for body in server.bodies()]
    assert keys[0] == "mine-1" and len(set(keys)) == 3


def test_an_answer_lost_after_the_write_is_retried_and_written_once() -> None:
    """The server commits, then the connection drops before the answer arrives: the retry
    carries the same key, so the server replays the first answer instead of writing again."""
    stored: dict[str, list[dict[str, Any]]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["idempotency_key"] in stored:
            return httpx.Response(202, json=ACK)
        stored[body["idempotency_key"]] = body["messages"]
        raise httpx.ReadError("connection reset by peer", request=request)

    sgme = client.Client("http://sgme.test", retry=FAST, transport=httpx.MockTransport(handler))
    assert append(sgme).first_seq == 1
    assert list(stored.values()) == [[MESSAGE]]


def test_retries_stop_at_the_attempt_limit() -> None:
    server = Server(*(problem(503, "index-unavailable", "locked") for _ in range(4)))
    with pytest.raises(errors.IndexUnavailable) as caught:
        server.sync().files()
    assert len(server.requests) == FAST.attempts
    assert (caught.value.status, caught.value.detail) == (503, "locked")


def test_a_retry_after_past_the_deadline_ends_the_call_at_once() -> None:
    server = Server(problem(429, "too-many-requests", "cooling down", retry_after="120"))
    started = time.monotonic()
    with pytest.raises(errors.Throttled) as caught:
        server.sync(client.Retry(deadline=60)).refine(FILE_ID)
    assert time.monotonic() - started < 5
    assert len(server.requests) == 1
    assert (caught.value.status, caught.value.retry_after) == (429, 120.0)


def test_permanent_refusals_are_not_retried() -> None:
    for status, kind in ((404, "not-found"), (409, "conflict"), (422, "invalid-input")):
        server = Server(problem(status, kind))
        with pytest.raises(errors.PermanentError):
            append(server.sync())
        assert len(server.requests) == 1, kind


def test_a_call_that_is_not_repeatable_is_retried_only_when_the_request_never_left() -> None:
    refused = Server(httpx.ConnectError("connection refused"), httpx.Response(202, json=FILE_ROW))
    assert refused.sync().refine(FILE_ID).file_id == FILE_ID
    assert len(refused.requests) == 2

    lost = Server(httpx.ReadTimeout("timed out"), httpx.Response(202, json=FILE_ROW))
    with pytest.raises(errors.Unreachable) as caught:
        lost.sync().refine(FILE_ID)
    assert len(lost.requests) == 1
    assert "ReadTimeout" in caught.value.detail and f"/v1/files/{FILE_ID}/refine" in (
        caught.value.detail
    )
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)

    gateway = Server(httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(errors.TransientError) as failed:
        gateway.sync().refine(FILE_ID)
    assert len(gateway.requests) == 1 and failed.value.status == 502


def test_a_server_that_never_answers_is_unreachable_after_the_attempts() -> None:
    server = Server(*(httpx.ConnectError("connection refused") for _ in range(4)))
    with pytest.raises(errors.Unreachable) as caught:
        server.sync().file(FILE_ID)
    assert len(server.requests) == 4
    assert caught.value.status == 503 and "ConnectError: connection refused" in caught.value.detail


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_attempts_wait_what_retry_after_says_and_back_off_without_it() -> None:
    clock = Clock()
    call = exchange.Call("GET", "/v1/files", exchange.read_bytes)
    retry = client.Retry(attempts=10, deadline=30.0, backoff=1.0, max_backoff=4.0)
    attempts = exchange.Attempts(call, retry, clock=clock)
    request = httpx.Request("GET", "http://sgme.test/v1/files")

    def answer(status: int, **headers: str) -> httpx.Response:
        return httpx.Response(status, headers=headers, request=request)

    assert attempts.settle(answer(503, **{"retry-after": "7"})) == 7.0
    date = email.utils.formatdate(time.time() + 20, usegmt=True)
    waited = attempts.settle(answer(507, **{"retry-after": date}))
    assert isinstance(waited, float) and 18.0 <= waited <= 20.0
    waits = [attempts.settle(answer(503)) for _ in range(4)]
    assert all(isinstance(w, float) and 0 <= w <= 4.0 for w in waits)
    ok = answer(200)
    assert attempts.settle(ok) is ok
    clock.now += 29.5  # a wait of 1 s more would end past the 30 s deadline
    with pytest.raises(errors.TransientError):
        attempts.settle(answer(503, **{"retry-after": "1"}))


@pytest.mark.parametrize(
    ("field", "value"), [("attempts", 0), ("deadline", -1.0), ("backoff", float("nan"))]
)
def test_a_bad_retry_policy_is_refused_naming_the_value(field: str, value: float) -> None:
    with pytest.raises(errors.InvalidInput, match=f"Retry.{field} .*{value!r}"):
        client.Retry(**{field: value})  # type: ignore[arg-type]


def test_a_base_url_without_a_scheme_is_refused() -> None:
    with pytest.raises(errors.InvalidInput, match=r"'127\.0\.0\.1:8765'"):
        client.Client("127.0.0.1:8765")


# ---------------------------------------------------------------------------------------------
# errors


def error_classes() -> list[type[errors.SgmeError]]:
    found, todo = [], [errors.SgmeError]
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("cls", error_classes(), ids=lambda cls: cls.__name__)
def test_every_problem_type_becomes_its_error_class(cls: type[errors.SgmeError]) -> None:
    answer = problem(cls.status, cls.type, f"detail of {cls.__name__}", retry_after="3")
    answer.request = httpx.Request("GET", "http://sgme.test/v1/files")
    error = exchange.error_from(answer)
    # classes that share a type come back as the general one: ConstraintViolation is a
    # conflict, and the base class's type is a default, InternalError's
    shared = {
        errors.ConstraintViolation: errors.Conflict,
        errors.SgmeError: errors.InternalError,
        errors.TransactionAborted: errors.IndexUnavailable,
        errors.Deadlock: errors.IndexUnavailable,
        errors.SerializationFailure: errors.IndexUnavailable,
    }
    expected = shared.get(cls, cls)
    assert type(error) is expected
    assert (error.detail, error.status, error.retry_after) == (
        f"detail of {cls.__name__}",
        cls.status,
        3.0,
    )


def test_an_answer_that_is_no_problem_document_gets_the_class_of_its_status() -> None:
    request = httpx.Request("POST", "http://sgme.test/v1/append")
    cases = [
        (httpx.Response(502, text="<html>Bad Gateway</html>"), errors.TransientError),
        (httpx.Response(404, text="nothing here"), errors.NotFound),
        (httpx.Response(418, text="teapot"), errors.PermanentError),
        (httpx.Response(500, json={"error": "boom"}), errors.InternalError),
        (problem(405, "http-error", "Method Not Allowed"), errors.PermanentError),
    ]
    for answer, cls in cases:
        answer.request = request
        error = exchange.error_from(answer)
        assert type(error) is cls and error.status == answer.status_code, answer
    html = cases[0][0]
    assert exchange.error_from(html).detail == (
        "POST http://sgme.test/v1/append answered 502: <html>Bad Gateway</html>"
    )


def test_the_bearer_challenge_says_why_a_token_was_refused() -> None:
    request = httpx.Request("GET", "http://sgme.test/v1/files")
    bad = problem(
        401,
        "unauthorized",
        "unknown token",
        www_authenticate='Bearer realm="sgme", error="invalid_token"',
    )
    scope = problem(
        403,
        "forbidden",
        "needs read",
        www_authenticate='Bearer realm="sgme", error="insufficient_scope", scope="read"',
    )
    bad.request = scope.request = request
    unauthorized = exchange.error_from(bad)
    forbidden = exchange.error_from(scope)
    assert isinstance(unauthorized, errors.Unauthorized) and unauthorized.error == "invalid_token"
    assert isinstance(forbidden, errors.Forbidden) and forbidden.scope == "read"


def test_out_of_order_names_the_expected_sequence_and_is_never_retried() -> None:
    answer = problem(409, "out-of-order", "sequence 9 is ahead: this session expects 7 next")
    body = json.loads(answer.content) | {"expected_sequence": 7}
    answer = httpx.Response(409, json=body, headers={"content-type": "application/problem+json"})
    server = Server(answer)
    with server.sync() as sgme, pytest.raises(errors.OutOfOrder) as refused:
        append(sgme, sequence=9, idempotency_key="k9")
    assert (refused.value.expected, refused.value.status) == (7, 409)
    assert isinstance(refused.value, errors.Conflict)
    assert [b["sequence"] for b in server.bodies()] == [9]  # one try: the client decides
    missing = problem(409, "out-of-order", "ahead")  # a server that did not say which
    missing.request = httpx.Request("POST", "http://sgme.test/v1/append")
    error = exchange.error_from(missing)
    assert isinstance(error, errors.OutOfOrder) and error.expected is None
    without = Server(httpx.Response(202, json=ACK))
    with without.sync() as sgme:
        append(sgme)
    assert "sequence" not in without.bodies()[0]


# ---------------------------------------------------------------------------------------------
# answers and paging

FILE_ROW: dict[str, Any] = {
    "file_id": FILE_ID,
    "path": f"raw/sessions/{FILE_ID}.md",
    "source_type": "session",
    "agent_id": "a",
    "session_key": "s",
    "metadata": {},
    "started_at": "2026-08-03T11:18:06Z",
    "ended_at": None,
    "status": "new",
    "next_seq": 2,
    "flushed_seq": 1,
    "flushed_bytes": 200,
    "chain_head": None,
    "flush_pending": False,
    "flushed_at": None,
    "last_refined_seq": 0,
    "refined_at": None,
    "refine_epoch": 0,
    "refine_lease_until": None,
    "archived_at": None,
    "created_at": "2026-08-03T11:18:06Z",
    "updated_at": "2026-08-03T11:18:06Z",
    "message_count": 1,
    "pending_messages": 0,
}


def messages_page(*seqs: int) -> dict[str, Any]:
    return {
        "file_id": FILE_ID,
        "messages": [
            {
                "seq": seq,
                "ts": "2026-08-03T11:18:06Z",
                "role": "user",
                "content": f"m{seq}",
                "tool_name": None,
                "source_ref": f"{FILE_ID}:{seq}",
            }
            for seq in seqs
        ],
        "next_after_seq": seqs[-1] if seqs else None,
    }


def test_iter_messages_follows_next_after_seq_until_an_empty_page() -> None:
    server = Server(
        httpx.Response(200, json=messages_page(1, 2)),
        httpx.Response(200, json=messages_page(3)),  # short: the page's byte bound
        httpx.Response(200, json=messages_page()),
    )
    found = list(server.sync().iter_messages(FILE_ID, page_size=2))
    assert [(m.seq, m.content) for m in found] == [(1, "m1"), (2, "m2"), (3, "m3")]
    assert [dict(r.url.params) for r in server.requests] == [
        {"after_seq": "0", "limit": "2"},
        {"after_seq": "2", "limit": "2"},
        {"after_seq": "3", "limit": "2"},
    ]


def test_iter_files_follows_next_cursor_and_keeps_the_filters() -> None:
    other = dict(FILE_ROW, file_id=str(uuid.UUID(int=2, version=4)))
    server = Server(
        httpx.Response(200, json={"files": [FILE_ROW], "next_cursor": FILE_ID}),
        httpx.Response(200, json={"files": [other], "next_cursor": None}),
    )
    found = list(server.sync().iter_files(agent_id="a", status="new", page_size=1))
    assert [f.file_id for f in found] == [FILE_ID, other["file_id"]]
    assert dict(server.requests[1].url.params) == {
        "agent_id": "a",
        "status": "new",
        "limit": "1",
        "cursor": FILE_ID,
    }


def test_path_parameters_stay_one_segment_and_raw_is_bytes() -> None:
    server = Server(httpx.Response(200, content=b"---\n\xe7\xbb\xbf"))
    assert server.sync().raw("../../v1/l1") == b"---\n\xe7\xbb\xbf"
    assert server.requests[0].url.raw_path == b"/v1/files/..%2F..%2Fv1%2Fl1/raw"


def test_an_answer_of_the_wrong_shape_is_an_internal_error_naming_the_model() -> None:
    server = Server(httpx.Response(200, json={"files": "nope"}))
    with pytest.raises(errors.InternalError, match="GET /v1/files answered what is not a Files"):
        server.sync().files()


def test_health_returns_a_degraded_answer_instead_of_raising() -> None:
    degraded = {"status": "degraded", "index": "database is locked", "data_dir": "ok"}
    server = Server(httpx.Response(503, json=degraded))
    health = server.sync().health()
    assert (health.status, health.index, len(server.requests)) == ("degraded", degraded["index"], 1)


def hit(seq: int, score: float) -> dict[str, Any]:
    return {
        "source_ref": f"{FILE_ID}:{seq}",
        "file_id": FILE_ID,
        "seq": seq,
        "ts": "2026-08-03T11:18:06Z",
        "role": "user",
        "agent_id": "a",
        "session_key": "s",
        "snippet": "I prefer green tea.",
        "score": score,
    }


def test_search_sends_the_query_and_filters_and_answers_typed_hits() -> None:
    server = Server(
        problem(503, "index-unavailable", "index database stayed locked for 30 s"),
        httpx.Response(200, json={"hits": [hit(4, 2.5), hit(1, 0.5)]}),
        httpx.Response(200, json={"hits": []}),
    )
    with server.sync() as sgme:
        found = sgme.search(
            '"green tea" 数据库',
            agent_id="a",
            session_key="s 1",
            role="user",
            since=dt.datetime(2026, 8, 3, 13, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            until=dt.datetime(2026, 8, 4),
            limit=5,
        )
        words = sgme.search("tea", since="2026-08-03T11:00:00+02:00", match="all", mode="lexical")
        assert words.hits == [] and words.ranking is None
    assert isinstance(found, models.Hits)
    assert all(isinstance(h, models.Hit) for h in found.hits)
    assert [(h.source_ref, h.seq, h.snippet, h.score) for h in found.hits] == [
        (f"{FILE_ID}:4", 4, "I prefer green tea.", 2.5),
        (f"{FILE_ID}:1", 1, "I prefer green tea.", 0.5),
    ]
    first, retried, other = server.requests
    assert first.url == retried.url  # a read: the 503 retried as it was
    assert (first.method, first.url.path) == ("GET", "/v1/search")
    assert dict(first.url.params) == {
        "q": '"green tea" 数据库',
        "agent_id": "a",
        "session_key": "s 1",
        "role": "user",
        "since": "2026-08-03T11:00:00Z",  # an aware time, in UTC
        "until": "2026-08-04T00:00:00Z",  # a naive one is UTC already
        "limit": "5",
        "match": "any",  # ranked, the default
    }
    assert dict(other.url.params) == {
        "q": "tea",
        "since": "2026-08-03T11:00:00+02:00",  # text goes as given
        "limit": str(client.DEFAULT_SEARCH_LIMIT),
        "match": "all",
        "mode": "lexical",
    }


def test_a_search_the_server_refuses_is_its_error_class() -> None:
    server = Server(problem(422, "invalid-input", "q has no word to search for: '!!'"))
    with pytest.raises(errors.InvalidInput, match="no word") as refused:
        server.sync().search("!!")
    assert refused.value.status == 422 and len(server.requests) == 1


#: how a hybrid search says it ranked (GET /v1/search's ``ranking``)
HYBRID = {"mode": "hybrid", "model": "fake-1", "embedding_lag": 3, "fallback": None}


def test_the_async_client_retries_pages_and_maps_errors_like_the_sync_one() -> None:
    server = Server(
        problem(503, "overloaded", retry_after="0"),
        httpx.Response(202, json=ACK),
        httpx.Response(200, json=messages_page(1)),
        httpx.Response(200, json=messages_page()),
        problem(404, "not-found", f"no file {FILE_ID}"),
        httpx.Response(200, json={"hits": [hit(1, 1.0)], "ranking": HYBRID}),
    )

    async def scenario() -> tuple[Any, list[int], models.Hits]:
        transport = httpx.MockTransport(server)
        async with client.AsyncClient("http://sgme.test", retry=FAST, transport=transport) as s:
            ack = await s.append(agent_id="a", session_key="s", messages=[MESSAGE], wait=True)
            seqs = [m.seq async for m in s.iter_messages(ack.file_id)]
            with pytest.raises(errors.NotFound, match=f"no file {FILE_ID}"):
                await s.file(FILE_ID)
            return ack, seqs, await s.search("tea", agent_id="a", mode="hybrid")

    ack, seqs, found = asyncio.run(scenario())
    assert ack.file_id == FILE_ID and seqs == [1]
    assert [h.source_ref for h in found.hits] == [f"{FILE_ID}:1"]
    assert found.ranking is not None and found.ranking.model_dump() == HYBRID
    assert dict(server.requests[-1].url.params) == {
        "q": "tea",
        "agent_id": "a",
        "limit": "20",
        "match": "any",
        "mode": "hybrid",
    }
    first, second = server.bodies()[:2]
    assert first == second and first["idempotency_key"].startswith("client:")
    assert dict(server.requests[0].url.params) == {"wait": "flushed"}
