"""What people and agents browse: the sessions listing, one session as the listing shows it,
and the store's overview for an operator — what ``GET /v1/sessions``, the web view, ``sgme
ls/show`` and the MCP tools read (docs/views.md), through the :class:`Browsing` a
:class:`~pipeline.service.Service` holds (``service.browsing``). Each reads in a snapshot of
the index."""

from __future__ import annotations

from collections.abc import Collection

from pipeline import database, overview, reader, sessions
from pipeline.settings import Settings


class Browsing:
    """The browsing reads over one runtime's settings and index handle."""

    def __init__(self, settings: Settings, db: database.Database) -> None:
        self.settings = settings
        self.db = db

    def list_sessions(
        self, filters: sessions.Filters, *, offset: int = 0, limit: int = sessions.DEFAULT_LIMIT
    ) -> sessions.Page:
        """A page of the sessions listing: newest first, with titles, and how many match."""
        data_dir = self.settings.data_dir
        return sessions.list_sessions(self.db, data_dir, filters, offset=offset, limit=limit)

    def get_session(
        self, file_id: str, *, agents: Collection[str] | None = None
    ) -> sessions.Session:
        """One file as the sessions listing shows it (its row and its title); another agent's
        is NotFound, as a missing one."""
        row = reader.get_file(self.db, file_id, agents=agents)
        return sessions.describe(self.db, self.settings.data_dir, row)

    def store_overview(
        self, *, anomalies: int = overview.RECENT_ANOMALIES, agents: Collection[str] | None = None
    ) -> overview.Overview:
        """The store's state for an operator: backlog, lag, files by status, the latest
        ``anomalies`` (of ``agents``' files only, when given)."""
        return overview.read(self.db, recent=anomalies, agents=agents)
