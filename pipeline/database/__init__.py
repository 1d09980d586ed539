"""The index database: the plumbing under :mod:`pipeline.index`, :mod:`pipeline.ledger` and
:mod:`pipeline.catalog`.

* :mod:`~pipeline.database.engines` — engines for SQLite and PostgreSQL, and :func:`map_error`,
  the one place database errors become :mod:`pipeline.errors`;
* :mod:`~pipeline.database.transactions` — :class:`Database`, the handle the runtime gives
  every part of the pipeline: transactions, read snapshots, group commits, the clock;
* :mod:`~pipeline.database.commits` — group commit (docs/design.md §3);
* :mod:`~pipeline.database.statements` — :class:`Prepared` statements on the driver;
* :mod:`~pipeline.database.locks` — PostgreSQL's advisory locks;
* :mod:`~pipeline.database.schema` — migrations and the schema check.

``create_engine(url)`` stays the library's way to get an engine (programs embed it).
"""

from __future__ import annotations

from pipeline.database.commits import Again
from pipeline.database.engines import (
    create_engine,
    is_postgres_url,
    map_error,
    mapped,
    normalize_url,
)
from pipeline.database.locks import advisory_lock, advisory_locks, transaction_lock
from pipeline.database.schema import check_schema, migrate, revisions
from pipeline.database.statements import (
    Prepared,
    Sized,
    binds,
    insert,
    is_postgres,
    many_bound,
    savepoint,
)
from pipeline.database.transactions import Database

__all__ = [
    "Again",
    "Database",
    "Prepared",
    "Sized",
    "advisory_lock",
    "advisory_locks",
    "binds",
    "check_schema",
    "create_engine",
    "insert",
    "is_postgres",
    "is_postgres_url",
    "many_bound",
    "map_error",
    "mapped",
    "migrate",
    "normalize_url",
    "revisions",
    "savepoint",
    "transaction_lock",
]
