"""One exchange with the SGME L0 HTTP API, without I/O: what to send (:class:`Call`), how to
read the answer, whether to try again and after how long (:class:`Retry`, :class:`Attempts`),
and which :mod:`pipeline.errors` class a refusal stands for (:func:`error_from`).

What is tried again: an answer that says nothing was done and the same request may succeed
later (429, 503, 507), and a failure before the request left (no connection). When the call is
safe to repeat — a read, or a write that carries an idempotency key — also a connection that
broke or timed out before the answer came, and a proxy's 502 or 504: the request may have been
carried out, and sending it again cannot do it twice. Every other refusal is final.

:mod:`pipeline.client` runs these with httpx's blocking and async clients; keeping every
decision here means the two clients share them and only send requests and sleep.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from pipeline import errors

if TYPE_CHECKING:
    # pydantic is loaded by the first answer read as a model: a capture hook, which reads
    # none, does not pay for it (a fifth of its start)
    import pydantic

T = TypeVar("T")
Page = TypeVar("Page")
Item = TypeVar("Item")
M = TypeVar("M", bound="pydantic.BaseModel")

#: answers that mean "nothing was done; the same request may succeed later"
REFUSED_FOR_NOW = frozenset({429, 503, 507})
#: a proxy's "the server did not answer": the request may or may not have been carried out,
#: so only calls that are safe to repeat are retried after one
GATEWAY_FAILED = frozenset({502, 504})
#: transport failures worth another try
RETRYABLE_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
#: transport failures before the request left: safe to retry whatever the call
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclasses.dataclass(frozen=True)
class Retry:
    """How often and how long a call is tried (the module docstring says what is retried):
    at most ``attempts`` tries, and no wait that would end past ``deadline`` seconds after the
    first began (so a call takes at most ``deadline`` plus one request's timeout)."""

    attempts: int = 5  #: tries in all, the first included (1: never retry)
    deadline: float = 60.0  #: seconds from the first try after which no wait begins
    backoff: float = 0.5  #: seconds: the longest first wait without ``Retry-After``; doubles
    max_backoff: float = 10.0  #: seconds: the longest wait without ``Retry-After``

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise errors.InvalidInput(f"Retry.attempts must be at least 1, not {self.attempts!r}")
        for name in ("deadline", "backoff", "max_backoff"):
            value = getattr(self, name)
            if not value >= 0:
                raise errors.InvalidInput(f"Retry.{name} must be >= 0 seconds, not {value!r}")

    def delay(self, retries: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``retries`` + 1: what the server asked for, else
        a random time up to ``backoff · 2^retries`` (full jitter: clients that failed together
        do not come back together)."""
        if retry_after is not None:
            return retry_after
        return random.uniform(0.0, min(self.max_backoff, self.backoff * 2**retries))


DEFAULT_RETRY = Retry()
NO_RETRY = Retry(attempts=1)


@dataclasses.dataclass(frozen=True)
class Call(Generic[T]):
    """One API request, and how to read a successful answer to it (no I/O)."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: Mapping[str, str | int] = dataclasses.field(default_factory=dict)
    body: Mapping[str, Any] | None = None
    #: statuses read as the answer rather than raised (default: any 2xx)
    accept: frozenset[int] = frozenset()
    #: whether sending it again after an answer was lost is harmless: reads, and writes
    #: that carry an idempotency key
    repeatable: bool = True

    def succeeded(self, response: httpx.Response) -> bool:
        """Whether ``response`` is this call's answer (not an error)."""
        if self.accept:
            return response.status_code in self.accept
        return response.is_success

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request, built by ``http`` (its base URL, headers and timeout)."""
        content = None
        headers: dict[str, str] = {}
        if self.body is not None:
            # ensure_ascii off: the server counts bytes, and escapes would swell CJK text 2-3x
            content = json.dumps(self.body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        return http.build_request(
            self.method, self.path, params=dict(self.params), content=content, headers=headers
        )


@dataclasses.dataclass(frozen=True)
class Pages(Generic[Page, Item]):
    """A listing read page by page: the first page's call, the items of a page, and the call
    of the page after it (None at the end)."""

    first: Call[Page]
    items: Callable[[Page], Iterable[Item]]
    following: Callable[[Page], Call[Page] | None]


class Attempts:
    """The tries of one call, without I/O: after each outcome, the answer, the seconds to wait
    before sending again, or the error that ends the call."""

    def __init__(
        self,
        call: Call[Any],
        retry: Retry,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.call = call
        self.retry = retry
        self.clock = clock
        self.started = clock()
        self.tries = 0

    def settle(self, outcome: httpx.Response | httpx.RequestError) -> httpx.Response | float:
        """The answer when ``outcome`` is one; else the seconds to wait before the next try.
        Raises the :mod:`pipeline.errors` error that ends the call: a refusal that a retry
        cannot change, the last try's failure, or one whose wait would pass the deadline."""
        self.tries += 1
        cause: Exception | None = None
        if isinstance(outcome, httpx.Response):
            if self.call.succeeded(outcome):
                return outcome
            error = error_from(outcome)
            status = outcome.status_code
            again = status in REFUSED_FOR_NOW or (status in GATEWAY_FAILED and self.call.repeatable)
        else:
            cause = outcome
            error = _unreachable(outcome)
            again = isinstance(outcome, NOT_SENT) or (
                isinstance(outcome, RETRYABLE_TRANSPORT) and self.call.repeatable
            )
        if not again or self.tries >= self.retry.attempts:
            raise error from cause
        wait = self.retry.delay(self.tries - 1, error.retry_after)
        if self.clock() + wait - self.started > self.retry.deadline:
            raise error from cause
        return wait


# ---------------------------------------------------------------------------------------------
# answers and errors


def model_reader(model: type[M]) -> Callable[[httpx.Response], M]:
    """A reader that parses an answer as ``model``."""
    return shape_reader(model.model_validate_json, f"a {model.__name__}")


def shape_reader(parse: Callable[[bytes], T], what: str) -> Callable[[httpx.Response], T]:
    """A reader that parses an answer with ``parse`` (a pydantic model's or type adapter's
    ``validate_json``); an answer of another shape is the server's bug, said as not ``what``."""
    import pydantic

    def read(response: httpx.Response) -> T:
        try:
            return parse(response.content)
        except pydantic.ValidationError as exc:
            raise errors.InternalError(
                f"{response.request.method} {response.request.url.path} answered what is not "
                f"{what}: {exc.errors(include_url=False)[:3]}"
            ) from None

    return read


def read_bytes(response: httpx.Response) -> bytes:
    """An answer's body as it came (``/raw``)."""
    return response.content


def _kinds() -> dict[str, type[errors.SgmeError]]:
    """Every error class by its problem kind; where several share a kind (``conflict``), the
    most general one, found first going down the tree. The base class is left out: its kind
    is a default (``internal``), which the server sends for :class:`errors.InternalError`."""
    found: dict[str, type[errors.SgmeError]] = {}
    todo: list[type[errors.SgmeError]] = errors.SgmeError.__subclasses__()
    while todo:
        cls = todo.pop(0)
        found.setdefault(cls.type, cls)
        todo.extend(cls.__subclasses__())
    return found


_KINDS = _kinds()
#: the class of an answer that is no problem document of ours, by its status
_BY_STATUS: dict[int, type[errors.SgmeError]] = {
    401: errors.Unauthorized,
    403: errors.Forbidden,
    404: errors.NotFound,
    408: errors.RequestTimeout,
    409: errors.Conflict,
    410: errors.Gone,
    413: errors.RequestTooLarge,
    414: errors.UriTooLong,
    422: errors.InvalidInput,
    429: errors.Throttled,
    431: errors.HeadersTooLarge,
    502: errors.TransientError,
    503: errors.TransientError,
    504: errors.TransientError,
    507: errors.InsufficientStorage,
}
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def error_from(response: httpx.Response) -> errors.SgmeError:
    """The :mod:`pipeline.errors` error a refusal stands for: the class named by its problem
    document's ``type`` (else by its status), with its ``detail``, ``status`` and
    ``Retry-After``."""
    status = response.status_code
    problem = _problem(response)
    kind = str(problem.get("type", ""))
    cls = _KINDS.get(kind.removeprefix(errors.PROBLEM_PREFIX))
    if cls is None or not kind.startswith(errors.PROBLEM_PREFIX):
        fallback = errors.PermanentError if status < 500 else errors.InternalError
        cls = _BY_STATUS.get(status, fallback)
    detail = problem.get("detail")
    if not isinstance(detail, str) or not detail:
        text = response.text.strip().replace("\n", " ")[:200]
        detail = f"{response.request.method} {response.request.url} answered {status}: {text}"
    retry_after = _retry_after(response.headers.get("retry-after"))
    challenge = dict(_CHALLENGE.findall(response.headers.get("www-authenticate", "")))
    error: errors.SgmeError
    if issubclass(cls, errors.Throttled):
        error = cls(detail, retry_after=retry_after if retry_after is not None else 0.0)
    elif issubclass(cls, errors.Unauthorized):
        error = cls(detail, error=challenge.get("error", ""))
    elif issubclass(cls, errors.Forbidden):
        error = cls(detail, scope=challenge.get("scope", ""))
    elif issubclass(cls, errors.OutOfOrder):
        expected = problem.get("expected_sequence")
        error = cls(detail, expected=expected if type(expected) is int else None)
    else:
        error = cls(detail)
    error.retry_after = retry_after
    error.status = status
    return error


def _problem(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object, or {} when it has none (a proxy's HTML page, say)."""
    try:
        found = response.json()
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds, or an HTTP date (RFC 9110)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _unreachable(exc: httpx.RequestError) -> errors.Unreachable:
    """The error of a request that got no answer, naming the request and what happened."""
    try:
        where = f"{exc.request.method} {exc.request.url}"
    except RuntimeError:  # an error raised before the request existed
        where = "the server"
    return errors.Unreachable(f"no answer from {where}: {type(exc).__name__}: {exc}")
