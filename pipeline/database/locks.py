"""PostgreSQL's advisory locks, for what files and sessions need beyond row locks: a
file's flush or archive across hosts that share a networked volume (:func:`advisory_locks`),
and a session whose file does not exist yet (:func:`transaction_lock`). On SQLite each is a
no-op: its write transactions already run one at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pipeline.database import engines, statements


@contextlib.contextmanager
def advisory_lock(engine: sa.Engine, key: str) -> Iterator[None]:
    """On PostgreSQL, a session advisory lock on ``key`` (hosts sharing a networked volume
    cannot rely on flock); elsewhere nothing."""
    with advisory_locks(engine, [key]):
        yield


@contextlib.contextmanager
def advisory_locks(engine: sa.Engine, keys: Sequence[str]) -> Iterator[None]:
    """:func:`advisory_lock` on every key of ``keys``, taken in sorted order on one connection
    of their own (many files of one batch need not hold a connection each)."""
    if not statements.is_postgres(engine) or not keys:
        yield
        return
    try:
        conn = engine.connect()
    except sa_exc.SQLAlchemyError as exc:
        raise engines.map_error(exc) from exc
    try:
        for key in sorted(set(keys)):
            conn.execute(sa.text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": key})
        conn.commit()
    except sa_exc.SQLAlchemyError as exc:
        conn.invalidate()  # the session's end releases whatever it took
        conn.close()
        raise engines.map_error(exc) from exc
    try:
        yield
    finally:
        try:
            conn.execute(sa.text("SELECT pg_advisory_unlock_all()"))
            conn.commit()
        except sa_exc.SQLAlchemyError:
            conn.invalidate()  # closing the session releases the locks anyway
        conn.close()


#: the first key of :func:`transaction_lock`'s two-key advisory locks: PostgreSQL keeps them
#: apart from the one-key locks of :func:`advisory_lock`, so the two can never collide
_TRANSACTION_LOCK_SPACE = 0x53474D45  # "SGME"
_TRANSACTION_LOCK = sa.text("SELECT pg_advisory_xact_lock(CAST(:space AS integer), hashtext(:k))")


def transaction_lock(conn: sa.Connection, key: str) -> None:
    """Hold a lock on ``key`` until ``conn``'s transaction ends (PostgreSQL: a transaction
    advisory lock, for what has no row to lock yet). SQLite needs none: its write
    transactions (``BEGIN IMMEDIATE``) run one at a time."""
    if conn.dialect.name == "postgresql":
        conn.execute(_TRANSACTION_LOCK, {"space": _TRANSACTION_LOCK_SPACE, "k": key})
