"""How much one page of a listing holds: the defaults and bounds of ``limit`` and ``offset``
that the API, the CLI and the queries share. Standard library only (the CLI declares its
options with them before it loads anything else)."""

from __future__ import annotations

SESSIONS_DEFAULT_LIMIT = 20  #: sessions a page of the sessions listing holds unless asked
SESSIONS_MAX_LIMIT = 200  #: sessions a page may hold at most
SESSIONS_MAX_OFFSET = 10_000_000  #: sessions a listing may skip at most
SEARCH_DEFAULT_LIMIT = 20  #: hits a search answers with unless asked
SEARCH_MAX_LIMIT = 100  #: hits a search answers with at most
