"""Validation of what clients send (docs/design.md §2): one set of rules, the same messages on the
HTTP path (JSON bytes) and the Celery path (a dict)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from pipeline import document, errors, refs, validation
from pipeline.settings import Limits

FILE_ID = "3f2c1a9e-8b7d-4c6e-9a5f-1e2d3c4b5a69"
LIMITS = Limits(max_message_bytes=16, max_session_key=8, max_metadata_bytes=20)


def good(**changes: Any) -> dict[str, Any]:
    return {"role": "user", "content": "hi", "ts": "2026-08-03T11:18:06Z", **changes}


def body(message: object = None, **changes: Any) -> dict[str, Any]:
    messages = [good(), good(), good() if message is None else message]
    return {"agent_id": "hermes", "session_key": "s", "messages": messages, **changes}


def refused(value: dict[str, Any], limits: Limits = LIMITS) -> str:
    """The message for ``value``, which must be the same on both paths."""
    with pytest.raises(errors.InvalidInput) as as_dict:
        validation.parse_append(value, limits)
    try:
        encoded = json.dumps(value, allow_nan=False).encode()
    except ValueError:
        return as_dict.value.detail  # NaN: no JSON client can send it
    with pytest.raises(errors.InvalidInput) as as_json:
        validation.parse_append(encoded, limits)
    if "\\ud800" not in encoded.decode():  # JSON text cannot carry a lone surrogate
        assert as_json.value.detail == as_dict.value.detail
    return as_dict.value.detail


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        (
            good(role="robot"),
            "messages[2].role: must be one of 'user', 'assistant', 'system', 'tool'; got 'robot'",
        ),
        (good(role="tool"), "messages[2].tool_name: Field required"),
        (good(role="tool", tool_name="  "), "messages[2].tool_name: must not be blank"),
        (
            good(role="tool", tool_name="a\nb"),
            "messages[2].tool_name: contains control character '\\n' at index 1",
        ),
        (
            good(role="tool", tool_name="x" * 201),
            "messages[2].tool_name: String should have at most 200 characters, got 201",
        ),
        (good(tool_name="grep"), "messages[2].tool_name: Extra inputs are not permitted"),
        (good(ts="yesterday"), "messages[2].ts: bad timestamp 'yesterday': expected ISO 8601"),
        (good(ts=True), "messages[2].ts: bad timestamp True"),
        (good(ts=1e300), "messages[2].ts: timestamp out of range: 1e+300"),
        (good(content="a\x00b"), "messages[2].content: contains a NUL character"),
        (good(content=7), "messages[2].content: Input should be a valid string"),
        (
            good(content="x" * 17),
            "messages[2].content: String should have at most 16 characters, got 17",
        ),
        (good(content="é" * 9), "messages[2].content: is 18 bytes of UTF-8; the limit is 16"),
        (good(extra=1), "messages[2].extra: Extra inputs are not permitted"),
        (
            "text",
            "messages[2]: Input should be a valid dictionary or object to extract fields from",
        ),
        ({"content": "x"}, "messages[2].role: Field required"),
    ],
)
def test_messages_refused(message: object, detail: str) -> None:
    assert refused(body(message)) == detail


@pytest.mark.parametrize(
    ("changes", "detail"),
    [
        ({"session_key": ""}, "session_key: String should have at least 1 character, got 0"),
        ({"session_key": "x" * 9}, "session_key: String should have at most 8 characters, got 9"),
        ({"session_key": "a\nb"}, "session_key: contains control character '\\n' at index 1"),
        ({"session_key": "a\x85"}, "session_key: contains control character '\\x85' at index 1"),
        ({"session_key": 5}, "session_key: Input should be a valid string"),
        ({"agent_id": "a b"}, "agent_id must match [A-Za-z0-9_.-]{1,64}, got 'a b'"),
        ({"metadata": {"a": "é" * 6}}, "metadata is 21 bytes encoded; the limit is 20"),
        ({"metadata": [1]}, "metadata: Input should be a valid dictionary"),
        ({"messages": []}, "messages: List should have at least 1 item after validation, not 0"),
        ({"source_type": "upload"}, "source_type: Input should be 'session' or 'external'"),
        (
            {"idempotency_key": ""},
            "idempotency_key: String should have at least 1 character, got 0",
        ),
        ({"idempotency_key": "a\x00"}, "idempotency_key: contains a NUL character"),
        ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ],
)
def test_bodies_refused(changes: dict[str, Any], detail: str) -> None:
    assert refused(body(**changes)) == detail


def test_several_problems_are_all_named() -> None:
    detail = refused(body(good(ts="x"), agent_id="a b"))
    assert detail == (
        "agent_id must match [A-Za-z0-9_.-]{1,64}, got 'a b'; "
        "messages[2].ts: bad timestamp 'x': expected ISO 8601"
    )


def test_lone_surrogates_and_nan_are_refused() -> None:
    assert "messages[2].content" in refused(body(good(content="ab\ud800")))
    with pytest.raises(errors.InvalidInput, match="Invalid JSON"):
        validation.parse_append(
            b'{"agent_id":"a","session_key":"s","messages":[{"role":"user","content":"\\ud800"}]}'
        )
    assert refused(body(good(ts=float("nan")))) == "messages[2].ts: timestamp out of range: nan"
    assert refused(body(metadata={"a": float("nan")})).startswith("metadata is not plain JSON")


def test_not_json_and_not_an_object() -> None:
    with pytest.raises(errors.InvalidInput, match="Invalid JSON: EOF"):
        validation.parse_append(b'{"agent_id": ')
    with pytest.raises(errors.InvalidInput, match="append body must be a JSON object"):
        validation.parse_append(b"[]")
    with pytest.raises(errors.InvalidInput, match="append body must be a JSON object"):
        validation.parse_append(["x"])  # type: ignore[arg-type]


def test_metadata_depth_is_limited_on_both_paths() -> None:
    deep: dict[str, Any] = {"a": 1}
    for _ in range(16):
        deep = {"x": deep}
    assert refused(body(metadata=deep)) == "metadata is nested more than 16 levels deep"
    # Deeper than Python's recursion limit: refused, not a RecursionError.
    hostile: dict[str, Any] = {}
    for _ in range(50_000):
        hostile = {"x": hostile}
    with pytest.raises(errors.InvalidInput, match="nested more than 16 levels"):
        validation.parse_append(body(metadata=hostile))
    encoded = b'{"agent_id":"a","session_key":"s","metadata":' + b'{"x":' * 50_000
    with pytest.raises(errors.InvalidInput, match="recursion limit exceeded"):
        validation.parse_append(encoded + b"1" + b"}" * 50_001)


def test_accepted_and_normalised() -> None:
    received = dt.datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=dt.UTC)
    append = validation.parse_append(
        body(
            good(role="tool", tool_name="read_file", ts="2026-08-03T13:18:06+02:00"),
            metadata={"app": "x"},
            idempotency_key="k1",
        ),
        LIMITS,
        received_at=received,
    )
    assert append.messages[2] == document.Message("tool", "hi", "2026-08-03T11:18:06Z", "read_file")
    assert append.metadata == {"app": "x"}
    no_ts = validation.parse_append(body({"role": "system", "content": ""}), received_at=received)
    assert no_ts.messages[2] == document.Message("system", "", "2026-01-02T03:04:05.6Z")
    assert no_ts.digest == ""  # only keyed requests are compared
    limits = Limits(max_message_bytes=16)
    assert validation.parse_append(body(good(content="x" * 16)), limits).messages[2].content


def test_the_digest_is_of_the_normalised_request() -> None:
    """A retry that spells a default out, or a time with another offset, is the same request;
    a different message is not; a message without ts stays without (the receive time differs
    between a request and its retry)."""
    first = validation.parse_append(body(idempotency_key="k"))
    same = [
        body(idempotency_key="k", source_type="session"),
        body(idempotency_key="k", metadata=None),
        body(idempotency_key="k", metadata={}),
        body(good(ts="2026-08-03T13:18:06+02:00"), idempotency_key="k"),
    ]
    for variant in same:
        assert validation.parse_append(variant).digest == first.digest
        assert validation.parse_append(json.dumps(variant).encode()).digest == first.digest
    other = body(good(content="ho"), idempotency_key="k")
    assert validation.parse_append(other).digest != first.digest
    untimed = body({"role": "user", "content": "hi"}, idempotency_key="k")
    a = validation.parse_append(untimed, received_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    b = validation.parse_append(untimed, received_at=dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    assert a.digest == b.digest != first.digest


@pytest.mark.parametrize(
    "value",
    [0, -3, 2**31, True, 2.5, float("inf"), "2", [1]],
    ids=["zero", "negative", "too-large", "bool", "fraction", "inf", "string", "list"],
)
def test_sequence_refused(value: object) -> None:
    """A JSON integer from 1; true is no number here, and neither is "2"."""
    detail = f"sequence: must be an integer from 1 to 2147483647, got {value!r}"
    assert refused(body(sequence=value)) == detail


def test_sequence_accepted_and_part_of_the_digest() -> None:
    """A sequence is an integer from 1; it is part of what a retry must repeat, and leaves the
    digest of a body without one as it was (keys recorded before sequences existed)."""
    for value in (1, 2, 2**31 - 1):
        assert validation.parse_append(body(sequence=value)).sequence == value
        encoded = json.dumps(body(sequence=value)).encode()
        assert validation.parse_append(encoded).sequence == value
    # 2.0 is an integer to JSON Schema (and to a JavaScript sender): the same request as 2
    two = validation.parse_append(
        b'{"agent_id":"a","session_key":"s","sequence":2.0,'
        b'"idempotency_key":"k","messages":[{"role":"user","content":"x"}]}'
    )
    assert two.sequence == 2 and type(two.sequence) is int
    assert validation.parse_append(body()).sequence is None
    assert validation.parse_append(body(sequence=None)).sequence is None
    plain = validation.parse_append(body(idempotency_key="k"))
    first = validation.parse_append(body(idempotency_key="k", sequence=1))
    second = validation.parse_append(body(idempotency_key="k", sequence=2))
    assert len({plain.digest, first.digest, second.digest}) == 3
    assert validation.parse_append(body(idempotency_key="k", sequence=None)).digest == plain.digest
    schema = validation.schemas(LIMITS)[0].model_json_schema()["properties"]["sequence"]
    assert schema["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}


def test_uploads() -> None:
    upload = validation.parse_upload(
        {"agent_id": "a", "filename": "notes.txt", "content": "x", "idempotency_key": "u"}
    )
    assert upload.metadata == {"filename": "notes.txt"}
    assert upload.digest
    cases: list[tuple[dict[str, Any], str]] = [
        ({"filename": ""}, "filename: String should have at least 1 character, got 0"),
        ({"filename": "a\nb"}, "filename: contains control character '\\n' at index 1"),
        ({"content": 5}, "content: Input should be a valid string"),
        ({"content": "a\x00"}, "content: contains a NUL character"),
    ]
    for changes, detail in cases:
        base = {"agent_id": "a", "filename": "n", "content": "x"}
        with pytest.raises(errors.InvalidInput) as info:
            validation.parse_upload({**base, **changes})
        assert info.value.detail == detail
    small = Limits(max_append_bytes=4)
    with pytest.raises(errors.InvalidInput) as info:
        validation.parse_upload({"agent_id": "a", "filename": "n", "content": "é" * 3}, small)
    assert info.value.detail == "content: is 6 bytes of UTF-8; the limit is 4"


def test_the_schema_states_the_rules() -> None:
    """What the OpenAPI schema says is what the server checks (limits included)."""
    append, _ = validation.schemas(LIMITS)
    schema = append.model_json_schema()
    props = schema["properties"]
    assert props["agent_id"]["pattern"] == validation.AGENT_ID_PATTERN
    assert props["session_key"]["maxLength"] == 8
    assert props["messages"]["maxItems"] == 1000
    assert props["messages"]["minItems"] == 1
    assert schema["additionalProperties"] is False
    text = schema["$defs"]["TextMessage"]["properties"]
    assert text["content"]["maxLength"] == 16
    assert "pattern" in text["content"]
    assert text["ts"]["anyOf"][0] == {"type": "string", "format": "date-time"}


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("2026-08-03T11:18:06Z", "2026-08-03T11:18:06Z"),
        ("2026-08-03T11:18:06z", "2026-08-03T11:18:06Z"),
        ("2026-08-03T13:18:06+02:00", "2026-08-03T11:18:06Z"),
        ("2026-08-03T01:18:06-10:00", "2026-08-03T11:18:06Z"),
        ("2026-08-03T00:30:00+05:45", "2026-08-02T18:45:00Z"),
        ("2026-08-03T11:18:06", "2026-08-03T11:18:06Z"),
        ("2026-08-03 11:18:06", "2026-08-03T11:18:06Z"),
        (" 2026-08-03T11:18:06Z ", "2026-08-03T11:18:06Z"),
        ("2026-08-03T11:18:06.123456Z", "2026-08-03T11:18:06.123456Z"),
        ("2026-08-03T11:18:06.000001+01:00", "2026-08-03T10:18:06.000001Z"),
        ("2026-08-03T11:18:06.500000Z", "2026-08-03T11:18:06.5Z"),
        ("2026-08-03T11:18:06.000000Z", "2026-08-03T11:18:06Z"),
        ("0999-01-01T00:00:00Z", "0999-01-01T00:00:00Z"),
        (0, "1970-01-01T00:00:00Z"),
        (1785755886, "2026-08-03T11:18:06Z"),
        (1785755886.25, "2026-08-03T11:18:06.25Z"),
        (-62135596800, "0001-01-01T00:00:00Z"),
        (253402300799, "9999-12-31T23:59:59Z"),
    ],
)
def test_normalize_ts(value: object, want: str) -> None:
    assert validation.normalize_ts(value) == want
    assert document.HEADING.fullmatch(f"# {want} user")


def test_a_timestamp_in_the_files_form_is_kept_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked (a real time), not parsed, converted and formatted again."""

    def formatted(when: dt.datetime) -> str:
        raise AssertionError(f"formatted {when} again")

    monkeypatch.setattr(document, "format_ts", formatted)
    for text in ("2026-08-03T11:18:06Z", "0999-01-01T00:00:00.000001Z", "2026-08-03T11:18:06.5Z"):
        assert validation.normalize_ts(text) == text


def test_normalize_ts_default_is_receive_time() -> None:
    when = dt.datetime(2026, 8, 3, 13, 18, 6, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert validation.normalize_ts(None, default=when) == "2026-08-03T11:18:06Z"
    now = document.parse_ts(validation.normalize_ts(None))
    assert abs((now - dt.datetime.now(dt.UTC)).total_seconds()) < 5


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ("", "bad timestamp '': expected ISO 8601"),
        ("2026-13-01T00:00:00Z", "bad timestamp '2026-13-01T00:00:00Z': expected ISO 8601"),
        # in the file's form (which is kept as it is) but not a real time
        ("2026-02-30T00:00:00Z", "bad timestamp '2026-02-30T00:00:00Z': expected ISO 8601"),
        ("0000-01-01T00:00:00Z", "bad timestamp '0000-01-01T00:00:00Z': expected ISO 8601"),
        ("2026-08-03T24:00:00Z", "bad timestamp '2026-08-03T24:00:00Z': expected ISO 8601"),
        ("2026-08-03T11:60:00.5Z", "bad timestamp '2026-08-03T11:60:00.5Z': expected ISO 8601"),
        ("0001-01-01T00:00:00+01:00", "timestamp out of range: '0001-01-01T00:00:00+01:00'"),
        (float("inf"), "timestamp out of range: inf"),
        (10**20, "timestamp out of range: 100000000000000000000"),
        (253402300800, "timestamp out of range: 253402300800"),
        (False, "bad timestamp False"),
        ([2026], "bad timestamp [2026]"),
    ],
)
def test_normalize_ts_refuses(value: object, detail: str) -> None:
    with pytest.raises(errors.InvalidInput) as info:
        validation.normalize_ts(value)
    assert info.value.detail == detail


@pytest.mark.parametrize("value", ["hermes", "a", "A-Z_a.z-09", "x" * 64])
def test_check_agent_id_accepts(value: str) -> None:
    assert validation.check_agent_id(value) == value


@pytest.mark.parametrize("value", ["", "x" * 65, "a b", "a/b", "é", "a\n", None, 5])
def test_check_agent_id_refuses(value: object) -> None:
    with pytest.raises(errors.InvalidInput) as info:
        validation.check_agent_id(value)
    assert info.value.detail == f"agent_id must match [A-Za-z0-9_.-]{{1,64}}, got {value!r}"


def test_check_metadata() -> None:
    limits = Limits(max_metadata_bytes=20)
    assert validation.check_metadata(None) == {}
    assert validation.check_metadata({"a": "é" * 5 + "x"}, limits) == {"a": "é" * 5 + "x"}  # 20 B
    cases: list[tuple[object, str]] = [
        ({"a": "é" * 6}, "metadata is 21 bytes encoded; the limit is 20"),
        ([1], "metadata must be a JSON object, not list"),
        ("{}", "metadata must be a JSON object, not str"),
        (
            {"a": float("nan")},
            "metadata is not plain JSON: Out of range float values are not JSON compliant",
        ),
        ({"a": {1, 2}}, "metadata is not plain JSON: Object of type set is not JSON serializable"),
        ({"a": "\ud800"}, "metadata contains a lone surrogate at index 7"),
    ]
    for value, detail in cases:
        with pytest.raises(errors.InvalidInput) as info:
            validation.check_metadata(value, limits)
        assert info.value.detail == detail


def test_check_file_id_source_type_and_refs() -> None:
    assert refs.check_file_id(FILE_ID) == FILE_ID
    for bad in (FILE_ID.upper(), FILE_ID.replace("-4", "-1", 1), "../etc/passwd", 1):
        with pytest.raises(errors.InvalidInput, match="not a file_id"):
            refs.check_file_id(bad)
    assert validation.check_source_type("upload") == "upload"
    with pytest.raises(errors.InvalidInput) as info:
        validation.check_source_type("mail")
    assert info.value.detail == "source_type must be one of session, upload, external; got 'mail'"
    assert refs.parse(f"{FILE_ID}:12") == (FILE_ID, 12)
    assert refs.parse(f"{FILE_ID}:9999999999") == (FILE_ID, 9999999999)
    for seq in ("0", "01", "²", "٣", "-1", "+1", " 1", "1 ", "", "99999999999"):
        with pytest.raises(errors.InvalidInput, match="not a source_ref"):
            refs.parse(f"{FILE_ID}:{seq}")
