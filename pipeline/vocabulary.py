"""The words every layer shares, defined once: a file's :class:`Status`, the source types and
the message roles (docs/format.md). Standard library only, so that the format, the index, the
importers and the client can all name them without importing one another.

``pipeline.tables`` (``Status``, ``STATUSES``, ``REFINABLE``) and ``pipeline.document``
(``ROLES``, ``SOURCE_TYPES``) keep their old names for these.
"""

from __future__ import annotations

import enum
from typing import Literal, get_args


class Status(enum.StrEnum):
    """A file's status (docs/design.md §4): what happens to it next."""

    PENDING = "pending"  #: acknowledged, nothing on disk yet
    NEW = "new"  #: flushed messages past last_refined_seq
    REFINED = "refined"  #: everything flushed is refined
    ERROR = "error"  #: damaged, or its refinement failed for good
    ARCHIVED = "archived"  #: compressed under raw/archive/


STATUSES = tuple(Status)
#: statuses a file can be refined from
REFINABLE = (Status.NEW, Status.REFINED)

#: who said a message: the format's ``role`` (docs/format.md)
Role = Literal["user", "assistant", "tool", "system"]
ROLES: tuple[Role, ...] = get_args(Role)

#: where a file's messages came from: an agent's session, an uploaded document, an import
SourceType = Literal["session", "upload", "external"]
SOURCE_TYPES: tuple[SourceType, ...] = get_args(SourceType)

#: how a search ranks (docs/search.md, "Semantic search"): by words only, or by words and
#: meaning fused
SearchMode = Literal["lexical", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = get_args(SearchMode)

#: what a token may do; ``admin`` implies the others
SCOPES = ("append", "read", "refine", "admin")
