"""The read-only web view at ``/ui`` (sessions, a session, search, status), served by the API:
server-rendered with Jinja2, no script, styles from this server only (a strict
Content-Security-Policy), the API's tokens through a login form and a cookie."""

from __future__ import annotations

from fastapi import FastAPI


def mount(app: FastAPI) -> None:
    """Serve the view's pages on ``app``."""
    from pipeline.ui import pages

    app.include_router(pages.router)
