"""The index schema: Alembic migrations, and the check every command but ``migrate`` and
``serve`` makes before it works (a schema that is behind is refused, nothing changed).

A revision that changes what is derived from the files (the message catalog, its search
terms) runs no code of today's modules, which write today's schema: it asks for a **refill**
by name (``context.config.attributes["refill"].add("catalog")``), and :func:`migrate` has the
caller's ``refill`` do it once the schema is at head, in the same transaction. Without a
``refill`` (the set is then ``None``) the revision says to run ``sgme reindex`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pipeline import errors
from pipeline.database import engines


def alembic_config() -> Any:
    """The Alembic configuration of the index's migrations (``pipeline:migrations``)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "pipeline:migrations")
    return config


#: what fills again, at the newest schema, what revisions asked for (by name: ``catalog``)
Refill = Callable[[sa.Connection, frozenset[str]], None]


def migrate(engine: sa.Engine, *, refill: Refill | None = None) -> None:
    """Bring the schema to the newest Alembic revision; then, in the same transaction,
    ``refill`` what the revisions that ran asked to be made again from the files
    (:func:`pipeline.integrity.migrate` gives one that reads a data directory)."""
    from alembic import command

    config = alembic_config()
    asked: set[str] | None = None if refill is None else set()
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            config.attributes["refill"] = asked
            command.upgrade(config, "head")
            if refill is not None and asked:
                refill(conn, frozenset(asked))
    except sa_exc.SQLAlchemyError as exc:
        raise engines.map_error(exc) from exc


def revisions(engine: sa.Engine) -> tuple[set[str], set[str]]:
    """``(current, head)``: the schema revisions the database is at and the code needs."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = set(ScriptDirectory.from_config(alembic_config()).get_heads())
    try:
        with engine.connect() as conn:
            current = set(MigrationContext.configure(conn).get_current_heads())
    except sa_exc.SQLAlchemyError as exc:
        raise engines.map_error(exc) from exc
    return current, head


def check_schema(engine: sa.Engine) -> None:
    """Refuse to work on a database whose schema is not the code's (nothing is changed)."""
    current, head = revisions(engine)
    if current == head:
        return
    where = ", ".join(sorted(current)) or "none (an empty database)"
    raise errors.Misconfigured(
        f"the index schema is at revision {where}; this version needs {', '.join(sorted(head))}: "
        "run `sgme migrate` first"
    )
