"""The store's upkeep: the cold archive and its restore, and the index's check and rebuild from
the files (``sgme archive/restore/fsck/reindex``; docs/design.md §5 and §6), through the
:class:`Upkeep` a :class:`~pipeline.service.Service` holds (``service.upkeep``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from pipeline import archive, database, errors, index, integrity, locks, reader, tables
from pipeline.settings import Settings


@dataclasses.dataclass(frozen=True)
class Upkeep:
    """The archive and index upkeep over one runtime's settings, index handle and file locks."""

    settings: Settings
    db: database.Database
    file_locks: locks.FileLocks

    @property
    def data_dir(self) -> Path:
        """Where the raw files are."""
        return self.settings.data_dir

    def archive_candidates(self, older_than_days: float) -> list[tables.FileRow]:
        """The files an archive run would compress now (``sgme archive --dry-run``)."""
        found = archive.cold_files(self.db, older_than_days=older_than_days, limit=1_000_000)
        with self.db.reading() as conn:
            rows = [index.get_file(conn, file_id) for file_id in found]
        return [row for row in rows if row is not None]

    def archive_cold(
        self,
        *,
        older_than_days: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> archive.Report:
        """The daily archive run (files unchanged ``older_than_days``, by default
        ``archive_after_days``)."""
        return archive.archive_cold(
            self.db,
            self.file_locks,
            self.data_dir,
            self.settings.archive,
            older_than_days=older_than_days,
            progress=progress,
        )

    def restore(self, file_id: str) -> tables.FileRow:
        """Move an archived file back to its live place; :class:`errors.Conflict` when it is
        not archived."""
        if not archive.restore(self.db, self.file_locks, self.data_dir, file_id):
            raise errors.Conflict(f"file {file_id} is not archived")
        return reader.get_file(self.db, file_id)

    def fsck(self, *, progress: Callable[[int], None] | None = None) -> list[integrity.Problem]:
        """Check every file against the index (it only reports)."""
        return integrity.fsck(self.db, self.data_dir, progress=progress)

    def count_files(self) -> int:
        """How many files the index holds (for progress bars)."""
        return integrity.count_files(self.db)

    def reindex(self, *, progress: Callable[[int], None] | None = None) -> integrity.ReindexReport:
        """Rebuild the index's file rows and message catalog from the files."""
        return integrity.reindex(
            self.db, self.file_locks, self.data_dir, self.settings.reindex, progress=progress
        )
