"""Alembic environment: runs on the connection ``index.migrate`` hands over, or on
``sqlalchemy.url`` / ``SGME_DATABASE_URL`` when invoked from the ``alembic`` command line."""

from __future__ import annotations

import os

from alembic import context

from pipeline import database, tables

config = context.config
target_metadata = tables.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("SGME_DATABASE_URL", "")
    engine = database.create_engine(url)
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
