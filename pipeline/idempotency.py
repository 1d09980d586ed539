"""Idempotency keys: a retried append gets the answer its first attempt got, and writes nothing.

The rule, in one place (docs/design.md §3): an append or upload may carry an
``idempotency_key`` (scoped per agent). The first request that commits with a key records the
digest of its normalised body and its answer (:func:`remember`); a later request with the same
key and the same digest is answered from that record (:func:`replay`), and one with another
digest is refused (:func:`conflict`), whether the first is recorded already or still held
waiting for its predecessor (:mod:`pipeline.ordering`). Two requests racing with one key: the
loser meets the winner's row when it records its own, rolls back (:class:`KeyRaced`) and is
answered, in the next group commit, from the record.

**Tombstones.** Erasing a file (:mod:`pipeline.erasure`) keeps the keys its appends were
recorded under, without the digest of what they held, as tombstones: a request with an erased
key is answered as erased and writes nothing, whatever its body, so an import, a capture or a
provider replay of the same source does not bring back what was erased
(:func:`replay` answers ``{"erased": file_id}``; :data:`ERASED` is their request hash).

**An earlier version's turn.** A client whose units an earlier version stored whole, as one
turn under another key, names that key as the append's ``legacy_key``: when it is recorded,
the append is answered from it and writes nothing (:func:`covered`).

The records are rows of ``append_keys`` (:mod:`pipeline.ledger`); this module holds the rule.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from pipeline import database, errors, ledger

#: the request hash of a tombstone: no digest (64 hex digits) is this
ERASED = "erased"


class KeyRaced(database.Again):
    """A concurrent request with the same idempotency key committed first: roll back and
    answer, in the next group, as the key's recorded request did."""


def conflict(key: str) -> errors.Conflict:
    """The refusal of a key reused with another body."""
    return errors.Conflict(f"idempotency_key {key!r} was already used with a different body")


def replay(
    conn: sa.Connection, agent_id: str, key: str | None, digest: str
) -> dict[str, Any] | None:
    """The answer recorded for ``key``, or None when the key is new (or there is none); a
    tombstone's (``{"erased": file_id}``) whatever the body. :class:`errors.Conflict` when it
    was recorded for another body."""
    if key is None:
        return None
    found = ledger.get_key(conn, agent_id, key)
    if found is None:
        return None
    recorded_hash, answer = found
    if recorded_hash != digest and recorded_hash != ERASED:
        raise conflict(key)
    return answer


def covered(conn: sa.Connection, agent_id: str, legacy_key: str | None) -> dict[str, Any] | None:
    """The answer recorded for the key an earlier version gave a turn (a tombstone's too), or
    None: then the append is new."""
    if legacy_key is None:
        return None
    found = ledger.get_key(conn, agent_id, legacy_key)
    return None if found is None else found[1]


def tombstone(file_id: str) -> dict[str, Any]:
    """What an erased key answers: the file it named, nothing of what it held."""
    return {"erased": file_id}


def remember(
    conn: sa.Connection,
    agent_id: str,
    key: str | None,
    digest: str,
    answer: dict[str, Any],
    *,
    now: dt.datetime,
) -> None:
    """Record the answer given for ``key`` (nothing without a key); :class:`KeyRaced` when a
    concurrent request holding the same key got there first."""
    if key is not None and not ledger.put_key(conn, agent_id, key, digest, answer, now=now):
        raise KeyRaced


def recorded_digest(conn: sa.Connection, agent_id: str, key: str) -> str | None:
    """The digest of the body ``key`` was recorded with, or None when it is unused."""
    found = ledger.get_key(conn, agent_id, key)
    return None if found is None else found[0]
