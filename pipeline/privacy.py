"""Secrets never reach the disk (docs/design.md §13): what an append or an upload becomes before it
is journaled, and the per-agent choice of whether that happens.

:func:`scrub_append` and :func:`scrub_upload` replace every secret :mod:`pipeline.redactor`
finds — in message contents, in an upload's text, in ``metadata`` (its keys as well as its
string values, and a string under a key that names a secret, ``{"db_password": "…"}``, as
an assignment) and in the ``idempotency_key`` — by its marker, and say how many there
were. :class:`pipeline.service.Service` calls them right
after validation on every path (``POST /v1/append``, ``POST /v1/uploads``, the ``sgme.append``
task, ``sgme import``, capture), so the journal, the file, the catalog, the search terms and
the appends held for their order only ever see the redacted text.

Whether an agent's input is redacted: the ``redact_secrets`` setting (on by default), unless
the agent has a policy of its own in ``agent_policies`` (set by an admin: ``PUT
/v1/agents/{agent_id}/policy``, ``sgme secrets policy``). :class:`Policies` keeps the table in
memory and reads it again at most every ``cache_seconds``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from pipeline import database, errors, redactor, tables, validation

_P = tables.agent_policies.c


def scrub_append(append: validation.Append) -> tuple[validation.Append, int]:
    """``append`` with its secrets replaced; and how many were. The digest stays the one of
    the request as sent, so a retry with the same key is still the same request (and its
    idempotency key, scrubbed the same way, the same key)."""
    count = 0
    messages = []
    for message in append.messages:
        found = redactor.redact(message.content)
        count += found.count
        messages.append(
            message if not found.count else dataclasses.replace(message, content=found.text)
        )
    metadata, in_metadata = _scrub_value(append.metadata)
    key, in_key = scrub_key(append.idempotency_key)
    count += in_metadata + in_key
    if not count:
        return append, 0
    scrubbed = dataclasses.replace(
        append, messages=tuple(messages), metadata=metadata, idempotency_key=key
    )
    return scrubbed, count


def scrub_upload(upload: validation.Upload) -> tuple[validation.Upload, int]:
    """:func:`scrub_append` for an upload."""
    found = redactor.redact(upload.content)
    metadata, in_metadata = _scrub_value(upload.metadata)
    key, in_key = scrub_key(upload.idempotency_key)
    count = found.count + in_metadata + in_key
    if not count:
        return upload, 0
    return (
        dataclasses.replace(upload, content=found.text, metadata=metadata, idempotency_key=key),
        count,
    )


def scrub_key(key: str | None) -> tuple[str | None, int]:
    """An idempotency key with its secrets replaced, cut to the column's width (a marker may
    be longer than what it replaces); and how many were. The same key always comes out the
    same, so a retry still finds its record; two keys that differ only in a secret become
    one key."""
    if key is None:
        return None, 0
    found = redactor.redact(key)
    return found.text[: validation.MAX_IDEMPOTENCY_KEY], found.count


def _scrub_value(value: Any, name: str | None = None) -> tuple[Any, int]:
    """A JSON value with the secrets in its strings replaced — in the keys of its objects too
    — and a string under a key that names a secret replaced whole when it is a literal."""
    if isinstance(value, str):
        found = redactor.redact_value(value, name=name)
        return found.text, found.count
    if isinstance(value, dict):
        count = 0
        out: dict[str, Any] = {}
        for key, item in value.items():
            scrubbed_key = redactor.redact(key)
            new_key = _unique(scrubbed_key.text, out)
            out[new_key], n = _scrub_value(item, name=key)
            count += n + scrubbed_key.count
        return out, count
    if isinstance(value, list):
        items = [_scrub_value(item, name=name) for item in value]
        return [item for item, _ in items], sum(n for _, n in items)
    return value, 0


def _unique(key: str, taken: dict[str, Any]) -> str:
    """``key``, or ``key (2)``, ``key (3)``, … when two keys redacted to the same text (no
    value may replace another)."""
    if key not in taken:
        return key
    number = 2
    while f"{key} ({number})" in taken:
        number += 1
    return f"{key} ({number})"


# ---------------------------------------------------------------------------------------------
# per-agent policies


@dataclasses.dataclass(frozen=True)
class Policy:
    """Whether an agent's input is redacted, and whether that is its own choice."""

    agent_id: str
    redact_secrets: bool
    #: None: the agent follows the ``redact_secrets`` setting
    own: bool | None
    updated_at: str | None = None
    updated_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As ``GET /v1/agents/{agent_id}/policy`` and ``sgme secrets policy --json`` show it."""
        return {
            "agent_id": self.agent_id,
            "redact_secrets": self.redact_secrets,
            "source": "default" if self.own is None else "agent",
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
        }


class Policies:
    """The agents' policies over ``default`` (the ``redact_secrets`` setting), kept in memory
    for at most ``cache_seconds``: a change made by another process takes effect here within
    that time (one made through this object, at once)."""

    def __init__(
        self,
        db: database.Database,
        *,
        default: bool = True,
        cache_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.default = default
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._own: dict[str, bool] = {}
        self._read_at = -float("inf")

    def redacts(self, agent_id: str) -> bool:
        """Whether ``agent_id``'s input is redacted now."""
        return self._table().get(agent_id, self.default)

    def _table(self) -> dict[str, bool]:
        with self._lock:
            if self._clock() - self._read_at < self.cache_seconds:
                return self._own
        with self.db.reading() as conn:
            own = {
                r.agent_id: bool(r.redact_secrets)
                for r in conn.execute(sa.select(_P.agent_id, _P.redact_secrets))
            }
        with self._lock:
            self._own, self._read_at = own, self._clock()
        return own

    def get(self, agent_id: str) -> Policy:
        """The policy of ``agent_id`` as stored (or the default's)."""
        validation.check_agent_id(agent_id)
        with self.db.reading() as conn:
            row = conn.execute(
                sa.select(tables.agent_policies).where(_P.agent_id == agent_id)
            ).first()
        if row is None:
            return Policy(agent_id, self.default, None)
        return Policy(
            agent_id,
            bool(row.redact_secrets),
            bool(row.redact_secrets),
            tables.iso(row.updated_at),
            row.updated_by,
        )

    def set(self, agent_id: str, redact_secrets: bool | None, *, actor: str) -> Policy:
        """Give ``agent_id`` a policy of its own (None: back to the default), recorded with who
        set it."""
        validation.check_agent_id(agent_id)
        if redact_secrets is not None and not isinstance(redact_secrets, bool):
            raise errors.InvalidInput(
                f"redact_secrets must be true, false or null, not {redact_secrets!r}"
            )
        with self.db.transaction() as conn:
            conn.execute(sa.delete(tables.agent_policies).where(_P.agent_id == agent_id))
            if redact_secrets is not None:
                conn.execute(
                    sa.insert(tables.agent_policies).values(
                        agent_id=agent_id,
                        redact_secrets=redact_secrets,
                        updated_at=self.db.now(),
                        updated_by=actor[:300],
                    )
                )
        with self._lock:
            self._read_at = -float("inf")
        return self.get(agent_id)

    def listed(self) -> list[Policy]:
        """Every agent with a policy of its own."""
        with self.db.reading() as conn:
            rows = conn.execute(sa.select(tables.agent_policies).order_by(_P.agent_id)).all()
        return [
            Policy(
                r.agent_id,
                bool(r.redact_secrets),
                bool(r.redact_secrets),
                tables.iso(r.updated_at),
                r.updated_by,
            )
            for r in rows
        ]
