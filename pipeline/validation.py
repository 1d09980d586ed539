"""What clients may send (docs/design.md §2), checked once, the same way on every path.

The request models are pydantic models built from the configured :class:`Limits`, so the API's
OpenAPI schema states exactly the rules the server applies, and HTTP (``parse_append`` on the
raw bytes, parsed by pydantic's JSON parser) and Celery (``parse_append`` on the task's dict)
refuse the same mistake with the same message: ``messages[0].ts: …``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

import annotated_types
import pydantic
import pydantic_core
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema

from pipeline import document, errors, refs
from pipeline.settings import Limits

MAX_IDEMPOTENCY_KEY = 200  #: characters (the index column's width)
MAX_TOOL_NAME = 200  #: characters
MAX_FILENAME = 255  #: characters
#: Unix seconds a timestamp may take: years 1 to 9999, as the file's timestamps can say
MIN_UNIX_TS = -62135596800
MAX_UNIX_TS = 253402300799
#: no C0/C1 control characters and no line or paragraph separators (one-line fields)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ONE_LINE = "^[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*$"
ONE_LINE_PATTERN = _ONE_LINE  #: text without control characters or line breaks
_NO_NUL = "^[^\\x00]*$"
#: one line with at least one character that is not white space
_TOOL_NAME = (
    "^[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*"
    "[^\\s\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029][^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*$"
)
AGENT_ID_PATTERN = "^[A-Za-z0-9_.-]{1,64}$"
MAX_QUERY_CHARS = 1000  #: characters of a search query (``GET /v1/search``'s ``q``)
_AGENT_ID = re.compile(AGENT_ID_PATTERN)
#: a \u escape of half a UTF-16 surrogate pair, which JSON parsers refuse on its own
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
DEFAULT_LIMITS = Limits()


# ---------------------------------------------------------------------------------------------
# single values


def check_text(value: str, what: str) -> bytes:
    """Return ``value`` as UTF-8, refusing NUL and lone surrogates."""
    if "\x00" in value:
        raise errors.InvalidInput(f"{what} contains a NUL character")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise errors.InvalidInput(
            f"{what} contains a lone surrogate at index {exc.start}"
        ) from None


def check_agent_id(value: object) -> str:
    """An agent_id: ``[A-Za-z0-9_.-]{1,64}``."""
    if not isinstance(value, str) or not _AGENT_ID.fullmatch(value):
        raise errors.InvalidInput(f"agent_id must match [A-Za-z0-9_.-]{{1,64}}, got {value!r}")
    return value


def check_source_type(value: object) -> str:
    """One of the source types files have."""
    if value not in document.SOURCE_TYPES:
        raise errors.InvalidInput(
            f"source_type must be one of {', '.join(document.SOURCE_TYPES)}; got {value!r}"
        )
    assert isinstance(value, str)
    return value


def normalize_ts(value: object, *, default: dt.datetime | None = None) -> str:
    """Any accepted timestamp as the file's form; ``None`` becomes ``default`` (receive time).

    Accepted: ISO 8601 / RFC 3339 with ``Z`` or an offset (converted to UTC), ISO 8601 without
    an offset (taken as UTC), or Unix seconds as a number.
    """
    if value is None:
        return document.format_ts(default or dt.datetime.now(dt.UTC))
    if isinstance(value, bool):
        raise errors.InvalidInput(f"bad timestamp {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or not MIN_UNIX_TS <= value <= MAX_UNIX_TS:
            raise errors.InvalidInput(f"timestamp out of range: {value!r}")
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return document.format_ts(epoch + dt.timedelta(seconds=value))
    if not isinstance(value, str):
        raise errors.InvalidInput(f"bad timestamp {value!r}")
    text = value.strip()
    # already the file's form, as most clients send it (no trailing zero in a fraction), and
    # a real time: kept as it is (try/except, not contextlib.suppress: every message of every
    # append comes here, and the suppressing object cost half of this check)
    if document.TS.fullmatch(text) and not ("." in text and text[-2] == "0"):
        try:
            dt.datetime.fromisoformat(text[:-1])
        except ValueError:
            pass  # not a real time: said below
        else:
            return text
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise errors.InvalidInput(f"bad timestamp {value!r}: expected ISO 8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    try:
        return document.format_ts(when.astimezone(dt.UTC))
    except (OverflowError, ValueError):
        raise errors.InvalidInput(f"timestamp out of range: {value!r}") from None


def check_metadata(value: object, limits: Limits | None = None) -> dict[str, Any]:
    """A JSON object nested at most ``max_metadata_depth`` deep and at most
    ``max_metadata_bytes`` once encoded; ``None`` is ``{}``."""
    limits = limits or DEFAULT_LIMITS
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"metadata must be a JSON object, not {type(value).__name__}")
    _check_depth(value, limits.max_metadata_depth)
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"metadata is not plain JSON: {exc}") from None
    size = len(check_text(encoded, "metadata"))
    if size > limits.max_metadata_bytes:
        raise errors.InvalidInput(
            f"metadata is {size} bytes encoded; the limit is {limits.max_metadata_bytes}"
        )
    return value


def _check_depth(value: dict[str, Any], limit: int) -> None:
    """Refuse nesting deeper than ``limit`` without recursing (a hostile depth would)."""
    level: list[dict[Any, Any] | list[Any]] = [value]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise errors.InvalidInput(f"metadata is nested more than {limit} levels deep")
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]


# ---------------------------------------------------------------------------------------------
# request bodies


@dataclasses.dataclass(frozen=True)
class Append:
    """A validated append: messages with their timestamps in the file's form."""

    agent_id: str
    session_key: str
    source_type: str
    metadata: dict[str, Any]
    idempotency_key: str | None
    messages: tuple[document.Message, ...]
    #: sha256 of the normalised request (what a retry must repeat); "" without a key
    digest: str = ""
    #: the sender's number for this append in its session (1, 2, …), or None (pipeline.ordering)
    sequence: int | None = None
    legacy_key: str | None = None  #: an earlier version's key of its turn (idempotency.covered)


@dataclasses.dataclass(frozen=True)
class Upload:
    """A validated upload: one UTF-8 text document."""

    agent_id: str
    content: str
    metadata: dict[str, Any]
    idempotency_key: str | None
    digest: str = ""


class _TooLarge(ValueError):
    """A size limit of content passed: the request is too large (413), not malformed."""


def _check(func: Any) -> AfterValidator:
    """A pydantic validator from a function that raises ``InvalidInput`` (reported at the
    field, as pydantic reports its own checks; a :class:`errors.RequestTooLarge` stays one)."""

    def run(value: Any) -> Any:
        try:
            return func(value)
        except errors.RequestTooLarge as exc:
            raise _TooLarge(exc.detail) from None
        except errors.InvalidInput as exc:
            raise ValueError(exc.detail) from None

    return AfterValidator(run)


class Text(annotated_types.GroupedMetadata):
    """A string field's rules, for ``Annotated[str, Text(...)]``. The character rules are
    checked here with messages a person can act on; the schema states the same rules as a
    ``pattern`` for clients and tools."""

    def __init__(
        self,
        *,
        min_length: int = 0,
        max_length: int | None = None,
        one_line: bool = False,
        nonblank: bool = False,
        max_bytes: int | None = None,
        **field: Any,
    ) -> None:
        self.pattern = _TOOL_NAME if nonblank else _ONE_LINE if one_line else _NO_NUL
        self.one_line = one_line
        self.nonblank = nonblank
        self.max_bytes = max_bytes
        self.field = Field(
            min_length=min_length,
            max_length=max_length,
            json_schema_extra={"pattern": self.pattern},
            **field,
        )

    def __iter__(self) -> Iterator[object]:
        yield self.field
        yield _check(self.check)

    def check(self, value: str) -> str:
        """Refuse control characters (one-line fields), NUL, blanks, too many bytes."""
        bad = _CONTROL.search(value) if self.one_line else None
        if bad:
            raise errors.InvalidInput(
                f"contains control character {bad.group()!r} at index {bad.start()}"
            )
        if "\x00" in value:
            raise errors.InvalidInput("contains a NUL character")
        if self.nonblank and not value.strip():
            raise errors.InvalidInput("must not be blank")
        if self.max_bytes is not None:
            size = len(value.encode("utf-8"))
            if size > self.max_bytes:
                raise errors.RequestTooLarge(
                    f"is {size} bytes of UTF-8; the limit is {self.max_bytes}"
                )
        return value


def _ts(value: object) -> str | None:
    if value is None:
        return None
    try:
        return normalize_ts(value)
    except errors.InvalidInput as exc:
        raise ValueError(exc.detail) from None


Timestamp = Annotated[
    str | None,
    PlainValidator(_ts),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "format": "date-time"},
                {"type": "number", "minimum": MIN_UNIX_TS, "maximum": MAX_UNIX_TS},
                {"type": "null"},
            ],
            "description": "RFC 3339 (converted to UTC) or Unix seconds; none: receive time",
        }
    ),
]
AgentId = Annotated[
    str,
    Field(json_schema_extra={"pattern": AGENT_ID_PATTERN}, examples=["hermes"]),
    _check(lambda value: check_agent_id(value) and value),
]
IdempotencyKey = Annotated[str, Text(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]


def _sequence(value: object) -> int | None:
    # A JSON integer; 2.0 too, which JSON Schema calls an integer (and a JavaScript sender
    # cannot tell from 2), but not true, 2.5 or "2".
    if value is None:
        return None
    number = int(value) if isinstance(value, float) and value.is_integer() else value
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= refs.MAX_SEQ:
        raise ValueError(f"must be an integer from 1 to {refs.MAX_SEQ}, got {value!r:.80}")
    return number


AppendSequence = Annotated[
    int | None,
    PlainValidator(_sequence),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 1, "maximum": refs.MAX_SEQ}, {"type": "null"}],
            "description": "the sender's number for this append, per (agent_id, source_type, "
            "session_key): 1 for the session's first append, then 2, 3, … with no gaps. "
            "Appends are applied in this order; a session uses sequences always or never",
        }
    ),
]


def _metadata(limits: Limits) -> tuple[AfterValidator, Any]:
    return (
        _check(functools.partial(check_metadata, limits=limits)),
        Field(
            description=f"a JSON object, at most {limits.max_metadata_bytes} bytes encoded and "
            f"{limits.max_metadata_depth} levels deep; only the append that creates the file "
            "sets it"
        ),
    )


def schemas(limits: Limits | None = None) -> tuple[type[BaseModel], type[BaseModel]]:
    """``(AppendBody, UploadBody)``: the request models for ``limits``."""
    return _schemas(limits or DEFAULT_LIMITS)


@functools.lru_cache(maxsize=8)
def _schemas(limits: Limits) -> tuple[type[BaseModel], type[BaseModel]]:
    content = Text(max_length=limits.max_message_bytes, max_bytes=limits.max_message_bytes)
    metadata_check, metadata_field = _metadata(limits)
    strict = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)

    class TextMessage(BaseModel):
        """A user, assistant or system message."""

        model_config = strict
        role: Literal["user", "assistant", "system"]
        content: Annotated[str, content]
        ts: Timestamp = None

    class ToolMessage(BaseModel):
        """A tool result: ``tool_name`` says which tool."""

        model_config = strict
        role: Literal["tool"]
        content: Annotated[str, content]
        ts: Timestamp = None
        tool_name: Annotated[
            str, Text(min_length=1, max_length=MAX_TOOL_NAME, one_line=True, nonblank=True)
        ]

    message = Annotated[TextMessage | ToolMessage, Field(discriminator="role")]

    class AppendBody(BaseModel):
        """Body of ``POST /v1/append`` and of the ``sgme.append`` Celery task."""

        model_config = strict
        agent_id: AgentId
        session_key: Annotated[
            str,
            Text(
                min_length=1,
                max_length=limits.max_session_key,
                one_line=True,
                examples=["20260803_191806_5b6c69"],
            ),
        ]
        source_type: Literal["session", "external"] = "session"
        metadata: Annotated[dict[str, Any] | None, metadata_check, metadata_field] = None
        idempotency_key: IdempotencyKey | None = None
        legacy_key: IdempotencyKey | None = None  # see Append.legacy_key
        sequence: AppendSequence = None
        messages: Annotated[
            list[message], Field(min_length=1, max_length=limits.max_append_messages)
        ]

        @pydantic.model_validator(mode="after")
        def _total(self) -> AppendBody:
            total = sum(len(m.content.encode("utf-8")) for m in self.messages)
            if total > limits.max_append_bytes:
                raise _TooLarge(
                    f"an append holds at most {limits.max_append_bytes} bytes of content; "
                    f"got {total}"
                )
            return self

    class UploadBody(BaseModel):
        """Body of ``POST /v1/uploads``: one UTF-8 text document."""

        model_config = strict
        agent_id: AgentId
        filename: Annotated[str, Text(min_length=1, max_length=MAX_FILENAME, one_line=True)]
        content: Annotated[
            str, Text(max_length=limits.max_append_bytes, max_bytes=limits.max_append_bytes)
        ]
        metadata: Annotated[dict[str, Any] | None, metadata_check, metadata_field] = None
        idempotency_key: IdempotencyKey | None = None

    return AppendBody, UploadBody


#: what a pattern means, for messages a person can act on
_PATTERN_NAMES = {
    refs.FILE_ID_PATTERN: "not a file_id (a UUID4)",
    refs.SOURCE_REF_PATTERN: "not a source_ref (file_id:seq)",
    AGENT_ID_PATTERN: "must match [A-Za-z0-9_.-]{1,64}",
}
#: parts of a location that are not field names: where FastAPI found a parameter
_NOT_FIELDS = ("query", "path", "header", "body", "cookie")


def describe(exc: pydantic.ValidationError) -> str:
    """One line per problem, each led by where it is: ``messages[0].ts: …``."""
    return describe_errors(exc.errors(include_url=False))


def describe_errors(found: Sequence[Mapping[str, Any]]) -> str:
    """:func:`describe` for pydantic's error dicts (FastAPI's parameter errors too)."""
    lines = []
    for error in found:
        where = ""
        located = len(error["loc"]) > 1 and error["loc"][0] in _NOT_FIELDS  # FastAPI's "query"
        loc = list(error["loc"][1 if located else 0 :])  # (a field may have that name)
        ctx = error.get("ctx") or {}
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc.append(str(ctx.get("discriminator", "")).strip("'"))  # the tag's own field
        for i, part in enumerate(loc):
            if isinstance(part, int):
                where += f"[{part}]"
            elif i > 0 and isinstance(loc[i - 1], int) and part in document.ROLES:
                continue  # the discriminator's tag, not a field
            else:
                where += f".{part}" if where else str(part)
        message = str(error["msg"]).removeprefix("Value error, ")
        value = error.get("input")
        if error["type"] == "string_pattern_mismatch":
            pattern = ctx.get("pattern")
            named, why = _PATTERN_NAMES.get(str(pattern), message), refs.fault(str(pattern), value)
            message = f"{named}, got {str(value)[:80]!r}" + (f": {why}" if why else "")
        elif error["type"] == "union_tag_invalid":
            message = f"must be one of {ctx['expected_tags']}; got {ctx['tag']!r}"
        elif error["type"] == "union_tag_not_found":
            message = "Field required"
        elif error["type"] in ("string_too_long", "string_too_short") and isinstance(value, str):
            message += f", got {len(value)}"
        last = str(loc[-1]) if loc else ""
        if last and message.startswith(last + " "):
            lines.append(where + message[len(last) :])  # "metadata is 9 bytes…" says it all
        else:
            lines.append(f"{where}: {message}" if where else message)
    return "; ".join(lines)


def _refuse_oversized(value: object, limits: Limits) -> None:
    """Refuse metadata far over its limit before anything walks all of it: the walk stops as
    soon as the bytes it has seen (keys and strings, without quotes or escapes: less than the
    encoding) pass 16 times ``max_metadata_bytes``, so 40 MB of metadata costs about what
    128 KiB would. Anything smaller gets the exact checks (its depth first) and their
    messages."""
    if not isinstance(value, dict | list):
        return
    seen, budget = 0, 16 * limits.max_metadata_bytes
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                seen += len(key) + 1
                pending.append(child)
        elif isinstance(item, list):
            seen += len(item)
            pending.extend(item)
        elif isinstance(item, str):
            seen += len(item)
        else:
            seen += 1
        if seen > budget:
            raise errors.InvalidInput(
                f"metadata is more than {budget} bytes encoded; the limit is "
                f"{limits.max_metadata_bytes}"
            )


def _validate(
    model: type[BaseModel], body: bytes | Mapping[str, Any], what: str, limits: Limits
) -> Any:
    """``body`` as a ``model``. JSON is parsed to Python objects first (by pydantic's parser,
    which refuses NaN, lone surrogates and nesting past 200 levels), so a request over HTTP
    and the same body from a Celery task get the same message for the same mistake."""
    if isinstance(body, bytes | bytearray):
        raw = bytes(body)
        try:
            # keys only: caching every string costs more than it saves on a large body
            body = pydantic_core.from_json(raw, allow_inf_nan=False, cache_strings="keys")
        except ValueError as exc:
            if _SURROGATE_ESCAPE.search(raw):
                raise errors.InvalidInput(
                    f"Invalid JSON: a \\u escape is a lone surrogate, not a character ({exc})"
                ) from None
            raise errors.InvalidInput(f"Invalid JSON: {exc}") from None
    if not isinstance(body, Mapping):
        raise errors.InvalidInput(f"{what} body must be a JSON object")
    _refuse_oversized(body.get("metadata"), limits)
    try:
        return model.model_validate(dict(body))
    except pydantic.ValidationError as exc:
        found = exc.errors(include_url=False)
        if all(_too_large(error) for error in found):
            raise errors.RequestTooLarge(describe(exc)) from None
        raise errors.InvalidInput(describe(exc)) from None
    except RecursionError:
        raise errors.InvalidInput(f"{what} body is nested too deeply") from None


def _too_large(error: Mapping[str, Any]) -> bool:
    """Whether a validation error is content past a size limit (413) rather than a malformed
    request (422): a message or a document longer than its limit, or an append's total."""
    if isinstance((error.get("ctx") or {}).get("error"), _TooLarge):
        return True
    loc = tuple(error.get("loc") or ())
    return error.get("type") == "string_too_long" and loc[-1:] == ("content",)


def _digest(normalised: Mapping[str, Any]) -> str:
    encoded = json.dumps(normalised, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def parse_append(
    body: bytes | Mapping[str, Any],
    limits: Limits | None = None,
    *,
    received_at: dt.datetime | None = None,
) -> Append:
    """Validate an append body (JSON bytes or a mapping); messages without ``ts`` get
    ``received_at``. Raises InvalidInput naming each problem."""
    model = _validate(schemas(limits)[0], body, "append", limits or DEFAULT_LIMITS)
    metadata = model.metadata or {}
    key = model.idempotency_key
    received = document.format_ts(received_at or dt.datetime.now(dt.UTC))
    # tool_name: a field, or missing (a text message): pydantic's __getattr__ is slow to say so
    messages = tuple(
        document.Message(m.role, m.content, m.ts or received, m.__dict__.get("tool_name"))
        for m in model.messages
    )
    digest = ""
    if key is not None:
        # The normalised request, so that a retry which spells a default out (or a timestamp
        # with another offset) is the same request; a message without ts stays without.
        digest = _digest(
            {
                "agent_id": model.agent_id,
                "session_key": model.session_key,
                "source_type": model.source_type,
                "metadata": metadata,
                "messages": [
                    [m.role, m.content, m.ts, m.__dict__.get("tool_name")] for m in model.messages
                ],
                # only when given: the digests of keys recorded before sequences existed stay
                **({} if model.sequence is None else {"sequence": model.sequence}),
            }
        )
    return Append(
        agent_id=model.agent_id,
        session_key=model.session_key,
        source_type=model.source_type,
        metadata=metadata,
        idempotency_key=key,
        messages=messages,
        digest=digest,
        sequence=model.sequence,
        legacy_key=model.legacy_key,
    )


def parse_upload(body: bytes | Mapping[str, Any], limits: Limits | None = None) -> Upload:
    """Validate an upload body; the filename goes into the metadata (never into a path)."""
    model = _validate(schemas(limits)[1], body, "upload", limits or DEFAULT_LIMITS)
    metadata = {**(model.metadata or {}), "filename": model.filename}
    check_metadata(metadata, limits)
    key = model.idempotency_key
    digest = ""
    if key is not None:
        digest = _digest(
            {"agent_id": model.agent_id, "metadata": metadata, "content": model.content}
        )
    return Upload(
        agent_id=model.agent_id,
        content=model.content,
        metadata=metadata,
        idempotency_key=key,
        digest=digest,
    )
