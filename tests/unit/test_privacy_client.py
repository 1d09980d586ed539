"""The client's side of redaction and erasure (``httpx.MockTransport``, no server): what
``redact``, ``erase`` and ``audit`` send, ``redacted`` read from an append's answer, and a 410
problem raised as :class:`errors.Gone`, never retried."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from pipeline import client, errors

FILE_ID = str(uuid.UUID(int=7, version=4))
FAST = client.Retry(attempts=3, deadline=5.0, backoff=0.001, max_backoff=0.001)


def _gone(request: httpx.Request) -> httpx.Response:
    problem = {
        "type": "urn:sgme:problem:gone",
        "title": "Gone",
        "status": 410,
        "detail": f"file {FILE_ID} was erased",
    }
    return httpx.Response(410, json=problem, headers={"content-type": "application/problem+json"})


def test_redact_erase_and_audit_send_what_the_api_takes() -> None:
    seen: list[httpx.Request] = []
    record = {
        "id": 1,
        "action": "redact",
        "file_id": FILE_ID,
        "agent_id": "hermes",
        "seq": 3,
        "source_ref": f"{FILE_ID}:3",
        "reason": "leak",
        "actor": "token t (ops)",
        "created_at": "2026-08-03T11:18:06.000000Z",
        "finished_at": "2026-08-03T11:18:06.000000Z",
        "removed_sha256": "0" * 64,
        "removed_bytes": 12,
        "messages": 1,
    }
    message = {
        "seq": 3,
        "ts": "2026-08-03T11:18:06Z",
        "role": "user",
        "content": "[REDACTED:message] removed 2026-08-03T11:18:06Z: leak",
        "tool_name": None,
        "source_ref": f"{FILE_ID}:3",
    }

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.url.path == "/v1/audit":
            return httpx.Response(200, json={"records": [record], "next_after": None})
        ref = {
            "source_ref": f"{FILE_ID}:3",
            "file_id": FILE_ID,
            "agent_id": "hermes",
            "session_key": "s",
            "source_type": "session",
            "message": message,
            "before": [],
            "after": [],
            "redaction": record,
        }
        return httpx.Response(200, json=ref)

    transport = httpx.MockTransport(answer)
    with client.Client("http://sgme", transport=transport, retry=FAST) as sgme:
        done = sgme.redact(f"{FILE_ID}:3", reason="leak")
        assert done.message.content.startswith("[REDACTED:message]")
        assert done.redaction.removed_sha256 == "0" * 64
        assert sgme.erase(FILE_ID, reason="asked") is None
        assert [r.action for r in sgme.audit(file_id=FILE_ID).records] == ["redact"]
    post, delete, listing = seen
    assert (post.method, post.url.path) == ("POST", f"/v1/refs/{FILE_ID}:3/redact")
    assert json.loads(post.content) == {"reason": "leak"}
    assert (delete.method, delete.url.path, delete.url.params["reason"]) == (
        "DELETE",
        f"/v1/files/{FILE_ID}",
        "asked",
    )
    assert listing.url.params["file_id"] == FILE_ID


def test_an_append_answer_says_how_many_secrets_were_redacted() -> None:
    ack = {
        "file_id": FILE_ID,
        "first_seq": 1,
        "last_seq": 1,
        "source_refs": [f"{FILE_ID}:1"],
        "status": "pending",
        "replayed": False,
        "redacted": 2,
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(202, json=ack))
    with client.Client("http://sgme", transport=transport, retry=FAST) as sgme:
        got = sgme.append(
            agent_id="a", session_key="s", messages=[{"role": "user", "content": "x"}]
        )
    assert got.redacted == 2


def test_a_410_is_gone_and_is_not_retried() -> None:
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return _gone(request)

    transport = httpx.MockTransport(answer)
    with (
        client.Client("http://sgme", transport=transport, retry=FAST) as sgme,
        pytest.raises(errors.Gone) as raised,
    ):
        sgme.ref(f"{FILE_ID}:1")
    assert raised.value.status == 410 and "erased" in raised.value.detail
    assert len(calls) == 1
