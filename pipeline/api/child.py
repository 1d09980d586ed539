"""One process of ``sgme api --workers N``: uvicorn's supervisor starts each one fresh
(``spawn``) and imports from here the guarded HTTP protocol and the app factory.

Nothing is shared with the parent but the listening socket: the parent put its settings in
the environment (``SGME_*``) before starting the processes, and each one reads them, opens its
own index db and broker connection, and serves. Every protocol of docs/design.md §3–§4 holds with
any number of such processes (the journal, the row locks and the fenced commits live in the
index, not in a process).
"""

from __future__ import annotations

import dataclasses

from fastapi import FastAPI

from pipeline.api import app as api_app
from pipeline.api import server
from pipeline.runtime import Runtime, long_running
from pipeline.settings import Settings

settings = Settings.load()
#: the HTTP protocol with this process's share of the connection bounds
Protocol = server.guarded_protocol(
    dataclasses.replace(settings.http, max_connections=server.connection_budget(settings.http))
)


def app() -> FastAPI:
    """The app of this process (uvicorn calls it once the process has started, its loggers
    set up)."""
    server.hide_query_values()
    runtime = Runtime.open(settings)
    app = api_app.create_app(runtime.workers.service(runtime))
    long_running()
    return app
