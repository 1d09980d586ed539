"""Statements on the driver: :class:`Prepared` (a Core statement compiled once, run straight
on the DBAPI cursor), savepoints, and the small builders the index's queries share."""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from pipeline import errors
from pipeline.database import engines


def is_postgres(conn_or_engine: sa.Connection | sa.Engine) -> bool:
    """True on PostgreSQL."""
    return conn_or_engine.dialect.name == "postgresql"


def insert(conn: sa.Connection, table: sa.Table) -> Any:
    """An INSERT that can take ``on_conflict_do_*`` on either database."""
    return (postgresql.insert if is_postgres(conn) else sqlite.insert)(table)


class Prepared:
    """A Core statement executed straight on the driver's cursor: the append and flush paths
    run a handful of statements per message, and SQLAlchemy's per-execution machinery costs
    about ten times the statement itself on SQLite (43 µs against 4 µs for a lookup by key,
    measured here). The statement is compiled once per dialect by SQLAlchemy, which also
    converts the values both ways (its types' bind and result processors); only the
    execution is ours. It runs in the connection's current transaction. Bind parameters are
    given by key; a statement's own literal values are bound as compiled.
    """

    def __init__(self, statement: Any) -> None:
        self.statement = statement
        self._compiled: dict[str, _Compiled] = {}

    def _for(self, dialect: sa.Dialect) -> _Compiled:
        found = self._compiled.get(dialect.name)
        if found is None:
            found = self._compiled[dialect.name] = _Compiled(self.statement, dialect)
        return found

    def execute(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> Any:
        """Run once; the driver's cursor (its ``rowcount`` and rows, unconverted)."""
        compiled = self._for(conn.dialect)
        cursor = _driver(conn).cursor()
        try:
            cursor.execute(compiled.sql, compiled.bind(params or {}))
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _mapped(conn, compiled.sql, exc) from exc
        return cursor

    def many(self, conn: sa.Connection, params: Sequence[Mapping[str, Any]]) -> None:
        """Run once per mapping in ``params``, in one driver call (:func:`many_bound`)."""
        compiled = self._for(conn.dialect)
        many_bound(conn, compiled.sql, compiled.bind_many(params))

    def rows(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Every row, its values converted as SQLAlchemy would."""
        compiled = self._for(conn.dialect)
        cursor = self.execute(conn, params)
        return [compiled.row(raw) for raw in cursor.fetchall()]

    def first(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> Any:
        """The first row (converted), or None."""
        compiled = self._for(conn.dialect)
        raw = self.execute(conn, params).fetchone()
        return None if raw is None else compiled.row(raw)

    def rowcount(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> int:
        """Run once; the number of rows changed."""
        return int(self.execute(conn, params).rowcount)


class Sized:
    """A statement written for ``n`` rows at once, built by ``build(n)`` with its bind names
    suffixed ``_0`` … ``_{n-1}`` and compiled once per ``n``: one driver call for many rows,
    at most :data:`MAX_ROWS` a statement. ``executemany`` makes one call per row, and on
    SQLite each lets go of the GIL and must win it back — waits behind the threads answering
    requests that a transaction holding the write lock makes everyone pay for."""

    #: rows a statement names at most (SQLite binds at most 32,766 values): as many as the
    #: appends of one of the API's batches, whose rows PostgreSQL then locks in one statement,
    #: in one order (pipeline.batches)
    MAX_ROWS = 256

    def __init__(self, build: Callable[[int], Any]) -> None:
        self._build = build
        self._by_size: dict[int, Prepared] = {}

    def _prepared(self, n: int) -> Prepared:
        found = self._by_size.get(n)
        if found is None:
            found = self._by_size[n] = Prepared(self._build(n))
        return found

    def _chunks(self, rows: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Prepared, Any]]:
        for start in range(0, len(rows), self.MAX_ROWS):
            part = rows[start : start + self.MAX_ROWS]
            params = {f"{k}_{i}": v for i, row in enumerate(part) for k, v in row.items()}
            yield self._prepared(len(part)), params

    def execute(self, conn: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run for ``rows`` (each row's values by their names without the suffix)."""
        for prepared, params in self._chunks(rows):
            prepared.execute(conn, params)

    def rows(self, conn: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Every row a query for ``rows`` finds, converted as SQLAlchemy would."""
        return [
            found
            for prepared, params in self._chunks(rows)
            for found in prepared.rows(conn, params)
        ]


class _Compiled:
    """One statement compiled for one dialect, with its value converters."""

    def __init__(self, statement: Any, dialect: sa.Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.positional = compiled.positiontup if dialect.positional else None
        self.binds = [
            (
                name,
                bind.key,
                bind.value,
                _quick(bind.type.dialect_impl(dialect).bind_processor(dialect)),
            )
            for bind, name in compiled.bind_names.items()
        ]
        #: positional drivers (SQLite's qmark): each bind in the statement's order
        self.ordered: list[tuple[str, Any, Callable[[Any], Any] | None]] | None = None
        #: for :meth:`bind_many` on such a driver (two binds or more): a row's values in one
        #: C call, and the positions of those that have a converter
        self._take: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
        self._convert: list[tuple[int, Callable[[Any], Any]]] = []
        if self.positional is not None:
            by_name = {name: (key, default, process) for name, key, default, process in self.binds}
            self.ordered = [by_name[name] for name in self.positional]
            if len(self.ordered) > 1:
                self._take = operator.itemgetter(*[key for key, _, _ in self.ordered])
                self._convert = [(i, p) for i, (_, _, p) in enumerate(self.ordered) if p]
        columns = getattr(statement, "exported_columns", ())
        self.columns = [c.key for c in columns]
        self.results = [
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns
        ]

    def bind(self, params: Mapping[str, Any]) -> Any:
        if self.ordered is not None:  # the tuple straight away: the catalog binds one a row
            get = params.get
            return tuple([get(k, d) if p is None else p(get(k, d)) for k, d, p in self.ordered])
        values = {}
        for name, key, default, process in self.binds:
            value = params.get(key, default)
            values[name] = process(value) if process is not None else value
        return values

    def bind_many(self, params: Sequence[Mapping[str, Any]]) -> list[Any]:
        """:meth:`bind` of each mapping. On a positional driver, the rows that hold every key
        are taken apart in one C call each (``itemgetter``) and only the values with a
        converter are converted: a flush binds a catalog row and a search row per message."""
        take, convert = self._take, self._convert
        if take is None:
            return [self.bind(p) for p in params]
        bound = []
        for p in params:
            try:
                values = take(p)
            except KeyError:  # a key left to its default
                bound.append(self.bind(p))
                continue
            if convert:
                converted = list(values)
                for i, process in convert:
                    converted[i] = process(converted[i])
                values = tuple(converted)
            bound.append(values)
        return bound

    def row(self, raw: Sequence[Any]) -> dict[str, Any]:
        return {
            key: process(value) if process is not None else value
            for key, value, process in zip(self.columns, raw, self.results, strict=True)
        }


_SAMPLES = (
    dt.datetime(2026, 12, 1, 9, 5, 7, 123),
    dt.datetime(2026, 1, 31, 23, 59, 59),
    dt.datetime(999, 2, 3, 4, 5, 6, 999999),
)


def _quick(process: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """``process``, or a quicker one that gives the same value: SQLite's DATETIME formats a
    naive datetime as ``isoformat(" ", "microseconds")`` does, in a quarter of the time (two
    datetimes a statement on the append and flush paths). Any other value, or a processor
    that does not give the same strings, keeps SQLAlchemy's."""
    if process is None:
        return None
    try:
        same = all(process(s) == s.isoformat(" ", "microseconds") for s in _SAMPLES)
    except Exception:
        same = False
    if not same:
        return process

    def quick(value: Any) -> Any:
        if type(value) is dt.datetime and value.tzinfo is None:
            return value.isoformat(" ", "microseconds")
        return process(value)

    return quick


def _driver(conn: sa.Connection) -> Any:
    # A connection the Database holds is detached from the pool, which leaves it no
    # driver_connection; for the sync drivers used here it is the DBAPI connection itself.
    fairy = conn.connection
    driver = fairy.driver_connection or fairy.dbapi_connection
    assert driver is not None
    return driver


def many_bound(conn: sa.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run ``sql`` (in the driver's own parameter style) once per row of ``rows``, values
    already in the driver's form, in one ``executemany`` on the driver: :class:`Prepared`
    for values made elsewhere (a flush's catalog rows, made before its transaction)."""
    cursor = _driver(conn).cursor()
    try:
        cursor.executemany(sql, rows)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _mapped(conn, sql, exc) from exc


def _mapped(conn: sa.Connection, sql: str, exc: Exception) -> errors.SgmeError:
    wrapped = sa_exc.DBAPIError.instance(sql, None, exc, conn.dialect.loaded_dbapi.Error)
    return engines.map_error(wrapped)


def savepoint(conn: sa.Connection, name: str, action: str) -> None:
    """``SAVEPOINT``, ``RELEASE SAVEPOINT`` or ``ROLLBACK TO SAVEPOINT`` ``name`` (``action``
    is ``"begin"``, ``"release"`` or ``"rollback"``), on the driver."""
    sql = {
        "begin": f"SAVEPOINT {name}",
        "release": f"RELEASE SAVEPOINT {name}",
        "rollback": f"ROLLBACK TO SAVEPOINT {name}",
    }[action]
    try:
        _driver(conn).cursor().execute(sql)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _mapped(conn, sql, exc) from exc


def binds(table: sa.Table) -> dict[str, Any]:
    """A bind parameter per column of ``table``, named and typed like it, for an INSERT's
    values (an autoincrement key left out)."""
    return {
        c.key: sa.bindparam(c.key, type_=c.type)
        for c in table.columns
        if not (c.primary_key and c.autoincrement is True)
    }
