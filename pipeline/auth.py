"""Bearer tokens of the HTTP API (docs/design.md §7): create, list, revoke and verify them,
and what a verified caller may see and do. No HTTP here: :mod:`pipeline.api.security` adapts it.

A token is ``sgme_`` followed by 43 URL-safe characters, 256 bits from :mod:`secrets`. The
index keeps only its sha256 (``api_tokens.token_hash``); a lookup is by that hash and the
match is confirmed with :func:`hmac.compare_digest`. Each token holds agent_ids (``*``: every
agent) and scopes:

``append``  ``POST /v1/append`` and ``POST /v1/uploads`` for its agent_ids
``read``    files, raw bytes, messages, refs and L1 items of its agent_ids
``refine``  ``POST /v1/files/{id}/refine`` (a full re-refine) of its agents' files
``admin``   all of the above, and ``/metrics`` when ``metrics_require_auth`` protects it

Auth is on once any token was ever created (a revoked token keeps its row, so revoking the
last token never opens the server) or when ``require_auth`` says so. A running server learns
of new and revoked tokens within ``token_cache_seconds``.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from pipeline import database, errors, tables, validation, vocabulary

log = logging.getLogger(__name__)

SCOPES = vocabulary.SCOPES
ALL_AGENTS = "*"
PREFIX = "sgme_"
SECRET_BYTES = 32  #: 256 bits of randomness per token
_SECRET = re.compile(r"^sgme_[A-Za-z0-9_-]{43}$")
MAX_NAME = 200  #: characters
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
LAST_USED_EVERY = 60.0  #: seconds: ``last_used_at`` is written at most this often per token
DEFAULT_CACHE_SECONDS = 5.0
MAX_CACHE_SECONDS = 60.0  #: a revoked token must stop working soon: never cache for longer
_MAX_CACHED = 4096  #: verified (or refused) secrets remembered per process

_t = tables.api_tokens.c
_BY_HASH = sa.select(tables.api_tokens).where(_t.token_hash == sa.bindparam("token_hash"))
_ANY = sa.select(_t.token_id).limit(1)


@dataclasses.dataclass(frozen=True)
class Token:
    """A token as the index describes it (never its secret)."""

    token_id: str
    name: str
    agent_ids: tuple[str, ...]
    scopes: tuple[str, ...]
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: tables.TokenRow) -> Token:
        """From an ``api_tokens`` row."""
        return cls(
            token_id=row.token_id,
            name=row.name,
            agent_ids=tuple(json.loads(row.agent_ids)),
            scopes=tuple(json.loads(row.scopes)),
            created_at=row.created_at,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
        )

    def to_json(self) -> dict[str, Any]:
        """As ``sgme token ls --json`` shows it."""
        return {
            "token_id": self.token_id,
            "name": self.name,
            "agent_ids": list(self.agent_ids),
            "scopes": list(self.scopes),
            "created_at": tables.iso(self.created_at),
            "last_used_at": self.last_used_at and tables.iso(self.last_used_at),
            "revoked_at": self.revoked_at and tables.iso(self.revoked_at),
        }


@dataclasses.dataclass(frozen=True)
class Created:
    """A new token and its secret: shown once, never stored."""

    token: Token
    secret: str


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who a request acts as: the agents whose data it may see (None: every agent) and the
    scopes it holds. ``token_id`` is None when auth is off."""

    token_id: str | None
    agents: frozenset[str] | None
    scopes: frozenset[str]

    @classmethod
    def of(cls, token: Token) -> Caller:
        """The caller a verified token makes; ``admin`` implies every scope."""
        agents = None if ALL_AGENTS in token.agent_ids else frozenset(token.agent_ids)
        scopes = frozenset(SCOPES) if "admin" in token.scopes else frozenset(token.scopes)
        return cls(token_id=token.token_id, agents=agents, scopes=scopes)

    def require(self, scope: str) -> None:
        """Forbidden unless the caller holds ``scope``."""
        if scope not in self.scopes:
            raise errors.Forbidden(f"this token lacks the {scope} scope", scope=scope)

    def require_agent(self, agent_id: str) -> None:
        """Forbidden unless the caller may write as ``agent_id``."""
        if self.agents is not None and agent_id not in self.agents:
            raise errors.Forbidden(f"this token does not hold agent_id {agent_id!r}")

    def listing(self, agent_id: str | None) -> frozenset[str] | None:
        """The agents a listing shows (None: all): the caller's, narrowed to ``agent_id`` when
        one is asked for — an agent the caller does not hold lists nothing, exactly like an
        agent without any files."""
        if agent_id is None:
            return self.agents
        if self.agents is None or agent_id in self.agents:
            return frozenset((agent_id,))
        return frozenset()


#: the caller of every request while auth is off (no token made, ``require_auth`` false)
OPEN = Caller(token_id=None, agents=None, scopes=frozenset(SCOPES))


def digest(secret: str) -> str:
    """The sha256 (hex) a secret is stored and looked up as."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def well_formed(secret: str) -> bool:
    """Whether ``secret`` has the shape of a token this module makes."""
    return _SECRET.match(secret) is not None


# ---------------------------------------------------------------------------------------------
# the operator's side: sgme token create | ls | revoke


def check_agent_ids(agent_ids: Iterable[str]) -> tuple[str, ...]:
    """Valid agent_ids, in order, once each; ``*`` alone stands for every agent."""
    found: list[str] = []
    for agent_id in agent_ids:
        if agent_id != ALL_AGENTS:
            validation.check_agent_id(agent_id)
        if agent_id not in found:
            found.append(agent_id)
    if not found:
        raise errors.InvalidInput("a token needs at least one agent_id (or '*' for every agent)")
    return (ALL_AGENTS,) if ALL_AGENTS in found else tuple(found)


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    """Known scopes, once each, in the order of :data:`SCOPES`."""
    given = {s.strip() for s in scopes if s.strip()}
    unknown = sorted(given - set(SCOPES))
    if unknown:
        raise errors.InvalidInput(
            f"unknown scope {', '.join(map(repr, unknown))}: scopes are {', '.join(SCOPES)}"
        )
    if not given:
        raise errors.InvalidInput(f"a token needs at least one scope of {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in given)


def create(
    db: database.Database, *, agent_ids: Iterable[str], scopes: Iterable[str], name: str = ""
) -> Created:
    """Make a token; the secret is in the answer and nowhere else (only its hash is stored)."""
    agents = check_agent_ids(agent_ids)
    held = check_scopes(scopes)
    if len(name) > MAX_NAME:
        raise errors.InvalidInput(f"name: at most {MAX_NAME} characters, got {len(name)}")
    validation.check_text(name, "name")
    if _CONTROL.search(name):
        raise errors.InvalidInput("name: control characters are not allowed")
    secret = PREFIX + secrets.token_urlsafe(SECRET_BYTES)
    token = Token(
        token_id=secrets.token_hex(8),
        name=name,
        agent_ids=agents,
        scopes=held,
        created_at=db.now(),
        last_used_at=None,
        revoked_at=None,
    )
    with db.transaction() as conn:
        conn.execute(
            sa.insert(tables.api_tokens).values(
                token_id=token.token_id,
                token_hash=digest(secret),
                name=name,
                agent_ids=json.dumps(list(agents)),
                scopes=json.dumps(list(held)),
                created_at=token.created_at,
            )
        )
    log.info("created token %s (%s) for %s", token.token_id, ",".join(held), ",".join(agents))
    return Created(token=token, secret=secret)


def list_tokens(db: database.Database) -> list[Token]:
    """Every token, revoked ones too, oldest first."""
    query = sa.select(tables.api_tokens).order_by(_t.created_at, _t.token_id)
    with db.reading() as conn:
        return [Token.from_row(tables.TokenRow.from_row(r)) for r in conn.execute(query)]


def revoke(db: database.Database, token_id: str) -> Token:
    """Revoke a token (again is a no-op); its row stays, so auth stays on."""
    with db.transaction() as conn:
        conn.execute(
            sa.update(tables.api_tokens)
            .where(_t.token_id == token_id, _t.revoked_at.is_(None))
            .values(revoked_at=db.now())
        )
        row = conn.execute(sa.select(tables.api_tokens).where(_t.token_id == token_id)).first()
    if row is None:
        raise errors.NotFound(f"no token {token_id}")
    log.info("revoked token %s", token_id)
    return Token.from_row(tables.TokenRow.from_row(row))


def exist(conn: sa.Connection) -> bool:
    """Whether any token was ever made (revoked ones count: auth stays on)."""
    return conn.execute(_ANY).first() is not None


def made_any(db: database.Database) -> bool:
    """:func:`exist`, read-only, on an index that may not be migrated yet (then: False)."""
    try:
        with db.engine.connect() as conn:
            return sa.inspect(conn).has_table(tables.api_tokens.name) and exist(conn)
    except sa.exc.SQLAlchemyError as exc:
        raise database.map_error(exc) from exc


def lookup(conn: sa.Connection, secret: str) -> Token | None:
    """The token whose secret this is (revoked or not), or None."""
    wanted = digest(secret)
    row = conn.execute(_BY_HASH, {"token_hash": wanted}).first()
    if row is None:
        return None
    found = tables.TokenRow.from_row(row)
    if not hmac.compare_digest(found.token_hash, wanted):
        return None
    return Token.from_row(found)


# ---------------------------------------------------------------------------------------------
# the server's side


class Verifier:
    """Turns the secret a request presents into a :class:`Caller`, for one API process.

    Answers (a token, or "no such token") are cached for ``cache_seconds``, so a server sees a
    token created or revoked by ``sgme token create|revoke`` within that time, without a
    restart and without a database read per request. ``last_used_at`` is written at most once
    per :data:`LAST_USED_EVERY` per token, never on the request's critical path twice.
    """

    def __init__(
        self,
        db: database.Database,
        *,
        require_auth: bool = False,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= cache_seconds <= MAX_CACHE_SECONDS:
            raise errors.Misconfigured(
                f"token_cache_seconds must be between 0 and {MAX_CACHE_SECONDS:g}, got "
                f"{cache_seconds:g}: a revoked token would keep working that long"
            )
        self.db = db
        self.require_auth = require_auth
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, tuple[float, Token | None]] = (
            collections.OrderedDict()
        )
        self._on = require_auth
        self._on_checked = -float("inf")
        self._touched: dict[str, float] = {}

    def enabled(self) -> bool:
        """Whether requests need a token: ``require_auth``, or a token exists (once seen, for
        the life of the process)."""
        if self._on or self._clock() - self._on_checked < self.cache_seconds:
            return self._on
        now = self._clock()
        with self.db.reading() as conn:
            found = exist(conn)
        with self._lock:
            self._on = self._on or found
            self._on_checked = now
        return self._on

    def caller(self, secret: str | None, *, required: bool = False) -> Caller:
        """Who presents ``secret`` (None: no token), reading the index when the cache has no
        fresh answer. While auth is off and not ``required``, everyone is :data:`OPEN`;
        otherwise Unauthorized for no token or a malformed, unknown or revoked one."""
        if not required and not self.enabled():
            return OPEN
        self._check_shape(secret)
        assert secret is not None
        key = digest(secret)
        hit, found = self._cached(key)
        if not hit:
            with self.db.reading() as conn:
                found = lookup(conn, secret)
            self._remember(key, found)
        token = self._valid(found)
        self._touch(token)
        return Caller.of(token)

    def quick(self, secret: str | None, *, required: bool = False) -> Caller | None:
        """:meth:`caller` answered from memory alone; None when that needs the index (then
        call :meth:`caller`, off the event loop)."""
        if not required and not self._on:
            if self._clock() - self._on_checked >= self.cache_seconds:
                return None
            return OPEN
        self._check_shape(secret)
        assert secret is not None
        hit, found = self._cached(digest(secret))
        if not hit:
            return None
        token = self._valid(found)
        if self._touch_due(token.token_id):
            return None
        return Caller.of(token)

    @staticmethod
    def _check_shape(secret: str | None) -> None:
        if secret is None:
            raise errors.Unauthorized(
                "this server requires a bearer token (Authorization: Bearer <token>); an "
                "operator makes one with `sgme token create`"
            )
        if not well_formed(secret):
            raise errors.Unauthorized(
                "malformed bearer token: expected Authorization: Bearer sgme_…",
                error="invalid_token",
            )

    @staticmethod
    def _valid(token: Token | None) -> Token:
        if token is None or token.revoked_at is not None:
            raise errors.Unauthorized("unknown or revoked token", error="invalid_token")
        return token

    def _cached(self, key: str) -> tuple[bool, Token | None]:
        """``(hit, token)``: whether a fresh answer for a secret's digest is cached, and that
        answer (None: no such token)."""
        with self._lock:
            found = self._cache.get(key)
        if found is None or found[0] <= self._clock():
            return False, None
        return True, found[1]

    def _remember(self, key: str, token: Token | None) -> None:
        if self.cache_seconds <= 0:
            return
        with self._lock:
            self._cache[key] = (self._clock() + self.cache_seconds, token)
            self._cache.move_to_end(key)
            while len(self._cache) > _MAX_CACHED:
                self._cache.popitem(last=False)

    def _touch_due(self, token_id: str) -> bool:
        with self._lock:
            last = self._touched.get(token_id, -float("inf"))
        return self._clock() - last >= LAST_USED_EVERY

    def _touch(self, token: Token) -> None:
        """Record the use in ``last_used_at``, at most once a minute per token (per process,
        and not at all when the index already shows a use in the last minute)."""
        now = self._clock()
        with self._lock:
            last = self._touched.get(token.token_id, -float("inf"))
            if now - last < LAST_USED_EVERY:
                return
            self._touched[token.token_id] = now
        stamp = self.db.now()
        try:
            with self.db.transaction() as conn:
                conn.execute(
                    sa.update(tables.api_tokens)
                    .where(
                        _t.token_id == token.token_id,
                        sa.or_(
                            _t.last_used_at.is_(None),
                            _t.last_used_at < stamp - dt.timedelta(seconds=LAST_USED_EVERY),
                        ),
                    )
                    .values(last_used_at=stamp)
                )
        except errors.TransientError as exc:  # a busy index must not fail the request
            log.warning("could not record the use of token %s: %s", token.token_id, exc.detail)
