"""Every error SGME L0 raises, grouped by what the caller should do about it.

    SgmeError                        status  problem type (urn:sgme:problem:<type>)
     ├── PermanentError              4xx     never retried: fix the request
     │    ├── InvalidInput           422     invalid-input      bad body, parameter or setting
     │    │    ├── FormatError       422     format-error       text that is not the L0 format
     │    │    ├── QueryTooCostly    422     query-too-costly   a search past search_timeout
     │    │    └── RequestTooLarge   413     too-large          a body or content past its size
     │    ├── HostNotAllowed         400     host-not-allowed   Host not in allowed_hosts
     │    ├── Unauthorized           401     unauthorized       no token, or a bad or revoked one
     │    ├── Forbidden              403     forbidden          a token without the scope/agent
     │    │    └── CrossSiteRequest  403     cross-site-request from a web page of another site
     │    ├── NotFound               404     not-found          no such file, message or token
     │    ├── Gone                   410     gone               a file erased on purpose
     │    ├── Conflict               409     conflict           contradicts what is recorded
     │    │    ├── ConstraintViolation 409   conflict           a unique/foreign key refused it
     │    │    └── OutOfOrder        409     out-of-order       a sequence that is not the next one
     │    ├── FileDamaged            409     file-damaged       a file differs from its index
     │    ├── UnsupportedMediaType   415     unsupported-media-type  not the declared body type
     │    ├── RequestTimeout         408     request-timeout    a body that came too slowly
     │    ├── UriTooLong             414     uri-too-long       a request target past its bound
     │    └── HeadersTooLarge        431     headers-too-large  a request head past its bounds
     ├── Throttled                   429     too-many-requests  repeat after retry_after seconds
     ├── TransientError              503     unavailable        retried by tasks with backoff
     │    ├── LockTimeout            503     lock-timeout       a per-file lock was not acquired
     │    ├── IndexUnavailable       503     index-unavailable  the database is unreachable/busy
     │    │    └── TransactionAborted 503   index-unavailable  rolled back by the database:
     │    │         ├── Deadlock                                  deadlock detected
     │    │         └── SerializationFailure                      could not serialize access
     │    ├── StorageUnavailable     503     storage-unavailable the data directory failed us
     │    ├── RefinerError           503     refiner-error      the refiner failed (LLM, webhook)
     │    ├── EmbedderUnavailable    503     embedder-unavailable the embedder failed (model, API)
     │    ├── Overloaded             503     overloaded         the journal backlog is too long
     │    ├── InsufficientStorage    507     insufficient-storage the disk cannot take more
     │    └── Unreachable            503     unreachable        (client) no answer from the server
     ├── Misconfigured               500     misconfigured      settings or schema need an operator
     └── InternalError               500     internal           a bug: logged once, never retried

The API answers every one as an RFC 9457 problem document whose ``type`` is
``urn:sgme:problem:<type>`` (:func:`problem_type`); FastAPI's own refusals use ``http-error``
and a request that matches no route ``not-found``.

An error may carry ``retry_after`` (seconds): the API sends it as ``Retry-After``, and extension
members (:meth:`SgmeError.members`): the problem document carries them, e.g. the
``expected_sequence`` of :class:`OutOfOrder`.
:mod:`pipeline.client` raises these same classes from the problem documents it gets back, each
with the ``status`` it was answered with (an answer that is no problem document, a proxy's
502 say, gets the class of its status).

Foreign exceptions (``OSError``, ``sqlalchemy.exc``, ``zstandard.ZstdError``) are mapped to one
of these where they cross into ``pipeline``'s public functions, so callers catch only these.
"""

from __future__ import annotations

from typing import Any, ClassVar

PROBLEM_PREFIX = "urn:sgme:problem:"


def problem_type(kind: str) -> str:
    """The problem+json ``type`` URN of an error kind."""
    return PROBLEM_PREFIX + kind


class SgmeError(Exception):
    """Base class of every error SGME L0 raises on purpose."""

    #: stable problem kind; the API's ``type`` is :func:`problem_type` of it
    type: ClassVar[str] = "internal"
    #: HTTP status the API answers with (an instance made by the client from an answer holds
    #: that answer's status)
    status: int = 500
    #: whether a task that hit this error should be retried
    retry: ClassVar[bool] = False

    def __init__(self, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        #: seconds after which the same call may succeed (the API's ``Retry-After``)
        self.retry_after = retry_after

    def members(self) -> dict[str, Any]:
        """Extension members of the problem document (RFC 9457 §3.2): what a client needs
        besides ``detail`` to act on the error."""
        return {}


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


class QueryTooCostly(InvalidInput):
    """A search that took longer than ``search_timeout`` and was stopped: narrow it (fewer
    common words, a filter) rather than repeat it."""

    type = "query-too-costly"


class HostNotAllowed(PermanentError):
    """The request's Host header is not one the server answers to (``allowed_hosts``): what a
    page that rebound its own DNS name to this server would send."""

    type = "host-not-allowed"
    status = 400


class Unauthorized(PermanentError):
    """The request carries no bearer token, or one that is malformed, unknown or revoked.

    ``error`` is RFC 6750's code for the ``WWW-Authenticate`` challenge: empty when no token
    was presented, ``invalid_token`` otherwise.
    """

    type = "unauthorized"
    status = 401

    def __init__(self, detail: str, *, error: str = "") -> None:
        super().__init__(detail)
        self.error = error


class Forbidden(PermanentError):
    """The token is valid but may not do this: a scope it lacks (``scope``), or an agent_id
    it does not hold."""

    type = "forbidden"
    status = 403

    def __init__(self, detail: str, *, scope: str = "") -> None:
        super().__init__(detail)
        self.scope = scope


class CrossSiteRequest(Forbidden):
    """A state-changing request a browser sent from another site (its ``Origin`` is neither
    this server nor an ``allowed_origins`` entry, or ``Sec-Fetch-Site`` says so): whatever it
    carries, a web page must not write into an agent's memory."""

    type = "cross-site-request"


class NotFound(PermanentError):
    """The file, message or key asked for does not exist."""

    type = "not-found"
    status = 404


class Gone(PermanentError):
    """The file was erased on purpose (``DELETE /v1/files/{id}``, ``sgme erase``): it and
    every ``source_ref`` into it are gone for good; the audit trail says when and by whom."""

    type = "gone"
    status = 410


class Conflict(PermanentError):
    """The request contradicts what is already recorded."""

    type = "conflict"
    status = 409


class ConstraintViolation(Conflict):
    """A unique or foreign key constraint refused a write (often a concurrent writer won)."""


class OutOfOrder(Conflict):
    """An append whose ``sequence`` is not the one its session expects next: ahead of it (a
    predecessor has not landed) or behind it (already applied). ``expected`` is the next one;
    the client decides (send the missing ones, or give up) — retrying the same request does
    not help until the session has moved."""

    type = "out-of-order"

    def __init__(self, detail: str, *, expected: int | None) -> None:
        super().__init__(detail)
        #: the sequence the session expects next (None when an answer did not say)
        self.expected = expected

    def members(self) -> dict[str, Any]:
        """``expected_sequence``: the sequence the session expects next."""
        return {"expected_sequence": self.expected}


class FileDamaged(PermanentError):
    """A raw file differs from what the index committed; ``sgme fsck`` tells how."""

    type = "file-damaged"
    status = 409
    #: False when this damage was already recorded (and logged) before
    first: bool = True


class RequestTooLarge(InvalidInput):
    """A request larger than the server takes: its body past ``http_max_request_bytes``, or
    its content past a size limit (a message, an append, a document)."""

    type = "too-large"
    status = 413


class UnsupportedMediaType(PermanentError):
    """A request body whose ``Content-Type`` is not the one its endpoint declares (a browser
    may send ``text/plain`` or a form across sites without asking first)."""

    type = "unsupported-media-type"
    status = 415


class RequestTimeout(PermanentError):
    """A request body that did not arrive within ``body_timeout``."""

    type = "request-timeout"
    status = 408


class UriTooLong(PermanentError):
    """A request target (path and query) longer than ``http_max_header_bytes``."""

    type = "uri-too-long"
    status = 414


class HeadersTooLarge(PermanentError):
    """A request head larger than ``http_max_header_bytes``, or with more than
    ``http_max_headers`` fields: refused before it is parsed to the end."""

    type = "headers-too-large"
    status = 431


class Throttled(SgmeError):
    """Refused for now (a full re-refine of the same file is running or just ran): the same
    call succeeds after ``retry_after`` seconds. Not retried by tasks."""

    type = "too-many-requests"
    status = 429

    def __init__(self, detail: str, *, retry_after: float) -> None:
        super().__init__(detail, retry_after=retry_after)


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


class TransactionAborted(IndexUnavailable):
    """The database rolled the whole transaction back to resolve a conflict between
    transactions: the same work, run again from its start, may succeed (the group committer
    does so at once, a few times; :mod:`pipeline.database.commits`)."""


class Deadlock(TransactionAborted):
    """PostgreSQL found two transactions waiting for each other (SQLSTATE 40P01)."""


class SerializationFailure(TransactionAborted):
    """PostgreSQL could not serialize the transaction with a concurrent one (SQLSTATE 40001)."""


class StorageUnavailable(TransientError):
    """The data directory could not be read or written."""

    type = "storage-unavailable"


class RefinerError(TransientError):
    """A refiner failed (bad answer, timeout, unreachable service); the job is retried."""

    type = "refiner-error"


class EmbedderUnavailable(TransientError):
    """The embedder failed (endpoint down, slow or wrong, model missing): vectors wait, a
    search ranks lexically."""

    type = "embedder-unavailable"


class Overloaded(TransientError):
    """More is waiting to be written than the limits allow: slow down and retry."""

    type = "overloaded"


class InsufficientStorage(TransientError):
    """The data volume is (nearly) full: nothing more is acknowledged until it has room."""

    type = "insufficient-storage"
    status = 507


class Unreachable(TransientError):
    """The client got no answer: the server could not be reached, or the connection failed or
    timed out before the answer came (raised by :mod:`pipeline.client`, never by the server)."""

    type = "unreachable"


class Misconfigured(SgmeError):
    """The deployment needs an operator: the index schema is behind, a setting is unusable."""

    type = "misconfigured"
    status = 500


class InternalError(SgmeError):
    """A bug (a malformed statement, a broken invariant): answered 500, never retried."""

    type = "internal"
    status = 500
