"""Every error SGME L0 raises, grouped by what the caller should do about it.

    SgmeError
     ├── PermanentError            4xx, never retried
     │    ├── InvalidInput          422  bad request body or argument
     │    │    └── FormatError      422  text that is not valid L0 format
     │    ├── NotFound              404
     │    ├── Conflict              409  e.g. idempotency key reused with another body
     │    └── FileDamaged           409  a raw file no longer matches its index (see fsck)
     └── TransientError            503, retried by tasks with backoff
          ├── LockTimeout               a per-file lock was not acquired in time
          └── IndexUnavailable          the database could not be reached or was busy

Foreign exceptions (``OSError``, ``sqlalchemy.exc``, ``zstandard.ZstdError``) are mapped to one
of these where they cross into ``pipeline``'s public functions, so callers catch only these.
"""

from __future__ import annotations

from typing import ClassVar


class SgmeError(Exception):
    """Base class of every error SGME L0 raises on purpose."""

    #: stable problem type (RFC 9457 ``type`` is ``https://sgme.dev/problems/<type>``)
    type: ClassVar[str] = "internal"
    #: HTTP status the API answers with
    status: ClassVar[int] = 500
    #: whether a task that hit this error should be retried
    retry: ClassVar[bool] = False

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class PermanentError(SgmeError):
    """The same call will fail the same way again: fix the input, don't retry."""

    type = "permanent"
    status = 400


class InvalidInput(PermanentError):
    """A request body, argument or configuration value is not acceptable."""

    type = "invalid-input"
    status = 422


class FormatError(InvalidInput):
    """Text that does not follow the L0 file format."""

    type = "format-error"


class NotFound(PermanentError):
    """The file, message or key asked for does not exist."""

    type = "not-found"
    status = 404


class Conflict(PermanentError):
    """The request contradicts what is already recorded."""

    type = "conflict"
    status = 409


class FileDamaged(PermanentError):
    """A raw file differs from what the index committed; ``sgme fsck`` tells how."""

    type = "file-damaged"
    status = 409


class TransientError(SgmeError):
    """Something outside the request failed; the same call may succeed later."""

    type = "unavailable"
    status = 503
    retry = True


class LockTimeout(TransientError):
    """A per-file lock could not be acquired in time."""

    type = "lock-timeout"


class IndexUnavailable(TransientError):
    """The index database could not be reached, or stayed locked too long."""

    type = "index-unavailable"


class StorageUnavailable(TransientError):
    """The data directory could not be read or written."""

    type = "storage-unavailable"
