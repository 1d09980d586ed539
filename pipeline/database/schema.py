"""The index schema: Alembic migrations, and the check every command but ``migrate`` and
``serve`` makes before it works (a schema that is behind is refused, nothing changed)."""

from __future__ import annotations

from pathlib import Path
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


def migrate(engine: sa.Engine, *, data_dir: Path | None = None) -> None:
    """Bring the schema to the newest Alembic revision; a revision that fills something from
    the files (the message catalog) reads them from ``data_dir``."""
    from alembic import command

    config = alembic_config()
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            config.attributes["data_dir"] = data_dir
            command.upgrade(config, "head")
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
