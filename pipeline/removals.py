"""Redaction and erasure: redact messages, erase files, sessions and agents, let an erasure's
tombstone go, and the audit trail of all of it (docs/privacy.md, docs/design.md §13), through
the :class:`Removals` a :class:`~pipeline.service.Service` holds (``service.removals``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence

from pipeline import audit, database, erasure, errors, locks, redaction, rewrite, tables
from pipeline.settings import Settings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Removals:
    """The removals over one runtime's settings, index handle and file locks."""

    settings: Settings
    db: database.Database
    file_locks: locks.FileLocks

    def who(self, token_id: str | None, reason: object, *, required: bool = True) -> rewrite.Who:
        """Who asks over HTTP (the token's id and name) and why, as the audit trail keeps it."""
        checked = redaction.check_reason(reason, required=required)
        with self.db.reading() as conn:
            return rewrite.Who(audit.token_actor(conn, token_id), checked, token_id)

    def audit_trail(
        self,
        *,
        agents: Collection[str] | None = None,
        file_id: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[tables.AuditRow]:
        """The audit trail's rows after the id ``after``, oldest first."""
        with self.db.reading() as conn:
            return audit.listed(
                conn,
                agents=None if agents is None else frozenset(agents),
                file_id=file_id,
                after=after,
                limit=limit,
            )

    def redact(
        self, refs: Sequence[str], who: rewrite.Who, *, agents: Collection[str] | None = None
    ) -> list[tables.AuditRow]:
        """Redact the messages ``refs`` name, all checked first, then in order (each file
        rewritten under its lock); then make the database files forget them. Their audit rows."""
        s = self.settings
        done = redaction.redact_all(self.db, self.file_locks, s.data_dir, refs, who, agents)
        redaction.compact(self.db)
        return done

    def erase_file(
        self, file_id: str, who: rewrite.Who, *, agents: Collection[str] | None = None
    ) -> erasure.Erased:
        """Erase one file and everything derived from it."""
        erased = erasure.erase_file(
            self.db, self.file_locks, self.settings.data_dir, file_id, who, agents=agents
        )
        redaction.compact(self.db)
        return erased

    def erase_agent(
        self,
        agent_id: str,
        who: rewrite.Who,
        *,
        session_key: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[list[erasure.Erased], int]:
        """Erase every file of an agent (of one session), and what waits for it."""
        done = erasure.erase_session(
            self.db,
            self.file_locks,
            self.settings.data_dir,
            agent_id,
            who,
            session_key=session_key,
            progress=progress,
        )
        redaction.compact(self.db)
        return done

    def count_agent_files(self, agent_id: str, session_key: str | None = None) -> int:
        """How many files erasing an agent (a session) would erase (for progress bars)."""
        return erasure.count_files(self.db, agent_id, session_key)

    def release_erased(
        self, file_id: str, who: rewrite.Who, *, agents: Collection[str] | None = None
    ) -> tables.AuditRow:
        """Let go of an erasure's tombstone: its units may be written again (audited)."""
        return erasure.release(self.db, file_id, who, agents=agents)

    def finish_interrupted(self, *, age: float = redaction.FINISH_AFTER) -> int:
        """Finish the redactions and erasures a crash interrupted more than ``age`` seconds
        ago (part of every sweep)."""
        try:
            data_dir = self.settings.data_dir
            return redaction.finish_interrupted(self.db, self.file_locks, data_dir, age=age)
        except errors.SgmeError as exc:  # the next sweep comes back to them
            log.warning("could not finish an interrupted redaction or erasure: %s", exc.detail)
            return 0
