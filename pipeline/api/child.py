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
import functools
from typing import Any

from fastapi import FastAPI

from pipeline.api import app as api_app
from pipeline.api import server
from pipeline.runtime import Runtime, long_running
from pipeline.settings import Settings


@functools.cache
def settings() -> Settings:
    """This process's settings, read once from the environment the parent prepared (when
    uvicorn asks for the protocol or the app, not when the module is imported)."""
    return Settings.load()


@functools.cache
def _protocol() -> Any:
    http = settings().http
    return server.guarded_protocol(
        dataclasses.replace(http, max_connections=server.connection_budget(http))
    )


def __getattr__(name: str) -> Any:
    """``Protocol``: the HTTP protocol with this process's share of the connection bounds
    (uvicorn imports it by name, ``pipeline.api.child:Protocol``), made on first use."""
    if name != "Protocol":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _protocol()


def app() -> FastAPI:
    """The app of this process (uvicorn calls it once the process has started, its loggers
    set up)."""
    server.hide_query_values()
    runtime = Runtime.open(settings())
    app = api_app.create_app(runtime.workers.service(runtime))
    long_running()
    return app
