"""Every setting, defined once: one frozen :class:`Settings` with its option groups, read from
a YAML file, then ``SGME_*`` environment variables, then explicit overrides (CLI flags). This is
the only module that reads the environment, and it imports nothing of the pipeline but
:mod:`pipeline.errors`: the modules that use an option group import it from here.

Precedence, lowest first: the defaults (the fields below: each default and its meaning is
written here and nowhere else; ``config/default.yaml`` repeats them for people, and a test
checks the two agree), the file named by ``SGME_CONFIG`` (or passed in), environment
variables, keyword overrides. Every key is flat (``refine_min_messages``,
``limits_max_session_key``, env ``SGME_REFINE_MIN_MESSAGES``); a YAML file may also nest a
group (``limits: {max_session_key: 512}``). A value that is not of its setting's type (a
boolean ``ture``, a port ``80a``) or out of its range is refused with the setting's name.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline import errors, remote

DEFAULT_LOCK_TIMEOUT = 30.0  #: seconds to wait for a per-file lock (flush, archive, restore)
DEFAULT_BUSY_TIMEOUT = 30.0  #: seconds SQLite waits for a lock before failing
DEFAULT_SQLITE_SYNCHRONOUS = "FULL"
#: SQLite ``synchronous`` levels a deployment may choose; FULL fsyncs the WAL at each commit,
#: so an acknowledgement survives a power cut (NORMAL would not: docs/design.md §3)
SQLITE_SYNCHRONOUS = ("FULL", "EXTRA")
DEFAULT_CACHE_SECONDS = 5.0  #: ``token_cache_seconds``
MAX_CACHE_SECONDS = 60.0  #: a revoked token must stop working soon: never cache for longer
DEFAULT_ORDER_WAIT_SECONDS = 60.0  #: ``order_wait_seconds``
MAX_ORDER_WAIT_SECONDS = 30 * 86400  #: the longest ``order_wait_seconds`` allowed (30 days)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Input limits (``limits_*``, docs/design.md §2); every one is refused with a clear
    error, nothing written."""

    max_session_key: int = 512  #: characters
    max_metadata_bytes: int = 8 * 1024  #: of the JSON encoding
    max_metadata_depth: int = 16  #: nested objects and lists
    max_message_bytes: int = 8 * 1024 * 1024  #: of UTF-8 per message
    max_append_messages: int = 1000
    max_append_bytes: int = 32 * 1024 * 1024  #: of UTF-8 content per append or upload


@dataclasses.dataclass(frozen=True)
class Http:
    """The HTTP server's bounds (``http_*``; docs/operations.md says what a client gets at
    each)."""

    #: a request body larger than this is refused with 413 before any of it is parsed (from
    #: Content-Length, or counted as a chunked body arrives); above the 32 MiB append limit,
    #: as JSON escaping makes a body larger than its content
    max_request_bytes: int = 64 * 1024 * 1024
    #: seconds a request body may take before it must keep arriving at ``min_body_rate``: a
    #: body is answered 408 once ``body_timeout + received / min_body_rate`` seconds passed
    body_timeout: float = 10.0
    min_body_rate: int = 16 * 1024  #: bytes per second a body must average after that
    header_timeout: float = 30.0  #: seconds for a request head to arrive (then closed)
    #: bytes of a request head (its target and header fields) at most: 431 past it (a
    #: target alone past it: 414), answered before the rest of the head is read
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100  #: header fields of one request at most (431 past it)
    #: seconds a connection refused and closed for its head (431, 414) or its body (413 as
    #: a chunked body passes the bound, 408) goes on reading, and dropping, what its client
    #: still sends, the refusal sent: closed at once, a client still sending would get a
    #: reset, which can discard the refusal before it is read (0: closed at once)
    refusal_linger: float = 2.0
    keepalive_timeout: float = 5.0  #: seconds an idle keep-alive connection is kept
    #: seconds a stopping server waits for the answers still going (a raw download to a slow
    #: reader) before it ends them: nothing else bounds how long such an answer lasts
    shutdown_timeout: float = 10.0
    #: open connections at most; past it, one that is waiting for a request head — or else
    #: the one whose body arrives slowest — is closed to make room for the new one
    max_connections: int = 4096
    #: open connections one client address may hold; past it, its own idle or slowest
    #: connection makes room (so one client cannot take the whole server)
    max_connections_per_client: int = 256
    #: answers one client address may have streaming at once (a raw download, the event
    #: stream of ``GET /mcp``: each lasts as long as its client reads); they do not count
    #: against ``max_connections_per_client``, and past this its oldest stream is closed
    max_streams_per_client: int = 64
    #: bytes of messages (their blocks in the file) one page of ``/messages`` or one ref's
    #: neighbours hold at most; one message always comes, however large
    max_page_bytes: int = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Backlog:
    """How much may wait to be written (``backlog_*``): past these, appends are refused with
    a ``Retry-After`` instead of acknowledged (docs/design.md §3, bounded work)."""

    #: acknowledged messages of one file not yet in it (503 past this)
    max_file_messages: int = 100_000
    #: bytes waiting in the journal over all files (503 past this)
    max_total_bytes: int = 1024 * 1024 * 1024
    #: bytes kept free on the data volume: an append is acknowledged only if the journal's
    #: backlog and the append fit in the free space above this (507 otherwise)
    min_free_bytes: int = 64 * 1024 * 1024
    retry_after: float = 5.0  #: seconds a refused client is told to wait
    #: bytes a flush writes, fsyncs and commits at a time (one journal row at least); a
    #: flush round of the embedded service reads this much over all its files
    flush_chunk_bytes: int = 8 * 1024 * 1024
    #: seconds a flush round of the embedded service waits, once kicked, for the kicks of
    #: concurrent appends to join it (docs/design.md §3, batched flushes)
    flush_linger: float = 0.02


@dataclasses.dataclass(frozen=True)
class Refine:
    """How refinement is scheduled and fed (``refine_*``; docs/refinement.md)."""

    min_messages: int = 20  #: new messages that make a file due at once
    idle_seconds: float = 60.0  #: quiet seconds after which fewer new messages are due
    #: how long a claim is reserved; the running job renews it every third of this, so a job
    #: lost with the broker or a killed worker frees its file within one lease
    lease_seconds: float = 60.0
    max_retries: int = 5  #: retries after the first attempt; then the file becomes ``error``
    retry_backoff: int = 2  #: seconds before the first retry (doubles, with jitter)
    window_tokens: int = 6000  #: refiner context budget per window (about 4 bytes a token)
    overlap_messages: int = 1  #: messages repeated from the previous window
    dispatch_interval: float = 5.0  #: seconds between beat dispatches
    #: seconds after a full re-refine over HTTP finished before the next one of the same file
    #: is accepted (while it runs, none is): each can cost real money with an LLM refiner
    cooldown_seconds: float = 300.0
    #: jobs one process refines at once (0: the refiner's own choice, one for a refiner whose
    #: work is Python in this process, as the builtin's is: parallel jobs would only take
    #: turns at the interpreter and at SQLite's write lock; no limit for one that waits on a
    #: model or a service)
    jobs_at_once: int = 0


@dataclasses.dataclass(frozen=True)
class Archive:
    """How cold files are archived (``archive_*``; docs/operations.md)."""

    after_days: float = 90.0  #: days a fully refined file must stay unchanged
    level: int = 10  #: zstd level: most of the ratio of level 19 at a fraction of the cost
    threads: int = 0  #: zstd worker threads per file (0: on the calling thread)
    workers: int = 2  #: files compressed at once
    #: temp files fsynced at once before their renames (the waits overlap; the filesystem
    #: commits them together)
    sync_threads: int = 16


@dataclasses.dataclass(frozen=True)
class Reindex:
    """How ``sgme reindex`` rebuilds the index from the files (``reindex_*``;
    docs/operations.md)."""

    #: files written per commit: fewer commits (each one durable) against a longer hold of
    #: the write lock, which appends by a running server wait behind on SQLite
    batch_files: int = 500
    #: processes that read and parse the files while this one writes (0: this one alone)
    workers: int = 2


@dataclasses.dataclass(frozen=True)
class Search:
    """How ``GET /v1/search`` ranks and what one ranked search may cost (``search_*``;
    docs/search.md)."""

    #: seconds one ranked search may take in the database; past it: 422 query-too-costly
    timeout: float = 5.0
    candidates: int = 200  #: messages ranked by BM25 before the neighbours' scores are added
    #: messages a word may be in and still count: a word in more is left out of a query that
    #: has rarer ones (its matches would cost more to score than they tell)
    common_matches: int = 5_000
    #: messages a query's common words are scored in, the newest of their matches: a query
    #: of common words only, or whose rarer words find too few, ranks these (a word in most
    #: messages would otherwise cost a score for each of them)
    common_scored: int = 10_000
    #: share of a word's score in a message that it scores found in the turns before the
    #: message (its context terms)
    context_weight: float = 0.3
    #: characters of each turn a hit is returned with (``GET /v1/search?context=N``)
    context_chars: int = 1_000
    #: what gives messages their vectors for the semantic leg (docs/search.md): "none" (lexical
    #: search alone), "local" (the model in the ``embed`` extra's wheel) or "openai" (an
    #: OpenAI-compatible ``/v1/embeddings`` endpoint, the ``embed_*`` settings)
    embedder: str = "none"


#: the values of ``search_embedder``
EMBEDDERS = ("none", "local", "openai")


@dataclasses.dataclass(frozen=True)
class Embed:
    """How messages get their vectors (``embed_*``; docs/search.md, semantic search): the
    endpoint of the ``openai`` embedder, and how the backlog of un-embedded messages drains."""

    url: str = ""  #: the endpoint's base URL, up to ``/v1`` (``http://127.0.0.1:11434/v1``)
    model: str = ""  #: the model the endpoint is asked for (``openai``; ``local`` has its own)
    api_key: str = ""  #: sent as ``Authorization: Bearer``; set it in the environment
    #: prepended to a query's and to a message's text by the ``openai`` embedder: models
    #: trained with prefixes want them (e5: "query: " and "passage: "; nomic-embed:
    #: "search_query: " and "search_document: "); the ``local`` model adds its own
    query_prefix: str = ""
    passage_prefix: str = ""
    timeout: float = 30.0  #: seconds one request to the endpoint may take
    batch: int = 32  #: messages embedded per request (or per call of the local model)
    #: messages of one file claimed at a time; a claim is committed whole, so this bounds
    #: the work lost to a crash and the memory of one round
    claim_messages: int = 256
    #: how long a claim is reserved before another may take it; at least what the claim's
    #: requests may take (claim_messages / batch requests, each at most ``timeout``) x 1.5
    lease_seconds: float = 120.0
    interval: float = 2.0  #: seconds between embedding rounds (the beat's ``sgme.embed``)
    #: characters of a message's text embedded (its start): a model reads ~512 tokens anyway
    max_chars: int = 2000
    threads: int = 1  #: CPU threads the ``local`` model uses (each costs a core)
    #: the niceness an embedding round's thread takes (Linux; 0 to 19, 0: as it is): where the
    #: rounds share cores with appends, the appends get them first (the backlog drains later)
    nice: int = 10
    #: bytes of decoded vectors a process keeps in memory for hybrid searches (int8, about
    #: ``dim`` + 4 bytes a message and ``dim`` / 8 of sign code: 64 MiB hold about 150,000
    #: messages of the local model), so a search scores them without reading them out of the
    #: index; files past the bound are
    #: read at every search as without it; 0 keeps none (pipeline/vector_cache.py)
    cache_bytes: int = 64 * 1024 * 1024
    #: vectors kept in memory for a search's scope at or below which every one is scored
    #: exactly; above it only the ``rerank`` nearest by their sign codes are (approximate:
    #: docs/search.md has what it keeps of the exact ranking); 0: always so. Below about
    #: twice ``rerank``, scoring every vector costs what the shortlist does
    exact_below: int = 8_000
    #: vectors scored exactly after the sign codes' ranking (at least ``search_candidates``)
    rerank: int = 4_000


@dataclasses.dataclass(frozen=True)
class Mcp:
    """What one MCP tool call answers at most (``mcp_*``; docs/views.md): a model's context is
    small, and one message may be 8 MiB. Each count is at most what the ``/v1`` route the
    tool calls takes."""

    max_search_hits: int = 50  #: hits one ``search_memory`` answers (≤ 100)
    max_context: int = 10  #: neighbours a side ``open_memory`` shows (≤ 50)
    max_sessions: int = 100  #: sessions one ``list_sessions`` answers (≤ 200)
    max_page_messages: int = 200  #: messages one ``read_session`` asks for (≤ 1000)
    message_chars: int = 20_000  #: characters of the message ``open_memory`` opens
    neighbour_chars: int = 2_000  #: characters of each neighbour it shows
    page_message_chars: int = 4_000  #: characters of each message of a ``read_session`` page
    page_chars: int = 60_000  #: characters of one ``read_session`` page (one message at least)
    #: bytes of a file the ``sgme://files/{file_id}`` resource gives (the rest: read_session)
    resource_bytes: int = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Ui:
    """The web view's pages and its login (``ui_*``; docs/views.md)."""

    page_sessions: int = 50  #: sessions per page of the listing (≤ 200)
    page_messages: int = 200  #: messages per page of a session (≤ 1000)
    page_items: int = 500  #: L1 items shown with a session, oldest first
    page_hits: int = 20  #: search hits per page (≤ 100)
    #: characters of a message rendered as Markdown; the rest is shown as plain text
    render_chars: int = 200_000
    #: Markdown marks (the characters Markdown acts on, line breaks included: what rendering
    #: costs, ``pipeline.ui.render.MARKS``) one page of a session renders over all its
    #: messages; past them, the rest of the page is shown as plain text
    render_page_marks: int = 100_000
    context_chars: int = 300  #: characters of each neighbour shown around a search hit
    context_bytes: int = 64 * 1024  #: bytes of a search hit's neighbours read, at most
    status_anomalies: int = 50  #: anomalies the status page lists, newest first
    max_form_bytes: int = 4096  #: a login form's body (413 past it)
    login_seconds: int = 7 * 24 * 3600  #: how long a login lasts in the browser (its cookie)


#: the most an ``mcp_*`` or ``ui_*`` count may be: what the /v1 route (or the listing) it
#: pages through takes in one request
AT_MOST = {
    "mcp_max_search_hits": 100,  # GET /v1/search: limit
    "mcp_max_context": 50,  # GET /v1/refs/{ref}: context
    "mcp_max_sessions": 200,  # GET /v1/sessions: limit
    "mcp_max_page_messages": 1000,  # GET /v1/files/{file_id}/messages: limit
    "ui_page_sessions": 200,  # the sessions listing's page
    "ui_page_messages": 1000,  # as /messages
    "ui_page_hits": 100,  # as /v1/search
}

#: option groups: settings key prefix → (Settings field, the group's frozen dataclass)
GROUPS: dict[str, tuple[str, type[Any]]] = {
    "refine": ("refine", Refine),
    "archive": ("archive", Archive),
    "reindex": ("reindex", Reindex),
    "search": ("search", Search),
    "embed": ("embed", Embed),
    "mcp": ("mcp", Mcp),
    "ui": ("ui", Ui),
    "limits": ("limits", Limits),
    "http": ("http", Http),
    "backlog": ("backlog", Backlog),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything configurable; see ``config/default.yaml`` for each value's meaning."""

    data_dir: Path = Path("data")
    database_url: str = ""
    broker_url: str = "memory://"
    #: seconds between two assertions, by every running process, that its store owns its
    #: Redis broker database (key ``sgme:deployment``): a wiped database names the store
    #: again within this time, before another store can claim it (0: only at start)
    broker_claim_interval: float = 5.0
    host: str = "127.0.0.1"
    port: int = 8765
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT  #: seconds to wait for a file's lock
    #: per-file lock files (``flock``) on the data volume; off only with PostgreSQL, whose
    #: advisory locks then keep processes on several hosts off one file (a networked volume
    #: where ``flock`` cannot be trusted: docs/scaling.md)
    file_locks: bool = True
    sweep_interval: float = 5.0  #: seconds between sweeps for un-flushed journal rows
    sweep_age: float = 3.0  #: seconds a journal row may wait before the sweeper re-kicks it
    #: seconds numbered appends (``sequence``) that came over Celery wait for a missing
    #: predecessor before they are written without it (the gap recorded: pipeline.ordering)
    order_wait_seconds: float = DEFAULT_ORDER_WAIT_SECONDS
    sqlite_busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    sqlite_synchronous: str = DEFAULT_SQLITE_SYNCHRONOUS
    #: Celery retries of ``sgme.flush`` (a lock timeout, a busy database)
    flush_max_retries: int = 8
    flush_retry_backoff: int = 1  #: seconds before the first retry (doubles, with jitter)
    #: Celery retries of ``sgme.append`` tasks (a busy database, a full backlog)
    append_max_retries: int = 8
    append_retry_backoff: int = 1  #: seconds before the first retry (doubles, with jitter)
    #: every /v1/* endpoint but /v1/health needs a bearer token even before any token exists
    #: (once one was made, they need one anyway); lets ``serve``/``api`` bind a network address
    require_auth: bool = False
    #: Host header names the API answers to, besides the address it binds; any other is a 400
    #: (what a DNS-rebinding page sends). "*" allows any: only behind a proxy that checks Host
    allowed_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
    #: web origins (``https://app.example.org``) whose pages may send state-changing requests
    #: (appends, uploads, refines) from a browser; a page of any other site is refused (403),
    #: with or without a token. The server's own origin is always allowed
    allowed_origins: tuple[str, ...] = ()
    metrics_require_auth: bool = False  #: ``/metrics`` needs an admin token
    #: seconds an API process trusts what it read about a token (at most 60): a token made or
    #: revoked by ``sgme token`` takes effect in running servers within this time
    token_cache_seconds: float = DEFAULT_CACHE_SECONDS
    #: replace credentials of well-known forms by ``[REDACTED:<kind>]`` before an append is
    #: acknowledged (docs/privacy.md); an admin may give an agent its own choice
    redact_secrets: bool = True
    refine: Refine = Refine()
    refiner: str = "builtin"  #: entry point name in group ``sgme.refiners``
    #: refiner options, e.g. {base_url, model, api_key, timeout} for openai, {url} for webhook
    refiner_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    archive: Archive = Archive()
    reindex: Reindex = Reindex()
    search: Search = Search()
    embed: Embed = Embed()
    #: worker side: expose Prometheus metrics on this port (0: off)
    worker_metrics_port: int = 0
    limits: Limits = Limits()
    http: Http = Http()
    backlog: Backlog = Backlog()
    mcp: Mcp = Mcp()
    ui: Ui = Ui()

    @property
    def index_url(self) -> str:
        """The database URL; by default a SQLite file inside the data directory."""
        return self.database_url or f"sqlite:///{(self.data_dir / 'index.sqlite3').resolve()}"

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Defaults ← YAML file ← ``SGME_*`` environment ← ``overrides`` (None means unset)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        path = path or env.get("SGME_CONFIG")
        if path:
            values.update(_flatten(_read_yaml(Path(path))))
        known = keys()
        for name in known:
            key = f"SGME_{name.upper()}"
            if key in env:
                values[name] = env[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "trust_network" in values:
            raise errors.InvalidInput(
                "the trust_network setting is gone: the API has bearer tokens now. Remove it, "
                "then create a token (`sgme token create --agent-id '*' --scope admin`) or set "
                "require_auth: true to listen on a network address"
            )
        unknown = set(values) - set(known)
        if unknown:
            raise errors.InvalidInput(f"unknown settings: {', '.join(sorted(unknown))}")
        return cls._build(values)

    @classmethod
    def _build(cls, values: dict[str, Any]) -> Settings:
        kwargs: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {prefix: {} for prefix in GROUPS}
        top = _types(cls)
        for name, raw in values.items():
            prefix, _, field = name.partition("_")
            if prefix in GROUPS and name not in top:
                kind = _types(GROUPS[prefix][1])[field]
                groups[prefix][field] = _convert(name, raw, kind)
            else:
                kwargs[name] = _convert(name, raw, top[name])
        for prefix, (attribute, group) in GROUPS.items():
            if groups[prefix]:
                kwargs[attribute] = group(**groups[prefix])
        settings = cls(**kwargs)
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse values out of their setting's range (:class:`errors.InvalidInput`)."""
        for name, value in _numbers(self):
            if value < 0:
                raise errors.InvalidInput(f"setting {name}: must not be negative, got {value!r}")
        if not 0 < self.port < 65536:
            raise errors.InvalidInput(f"setting port: must be 1-65535, got {self.port}")
        if self.sqlite_synchronous.upper() not in SQLITE_SYNCHRONOUS:
            raise errors.InvalidInput(
                f"setting sqlite_synchronous: must be one of {', '.join(SQLITE_SYNCHRONOUS)}, "
                f"got {self.sqlite_synchronous!r}: anything weaker can lose acknowledged "
                "appends in a power cut"
            )
        if not self.order_wait_seconds <= MAX_ORDER_WAIT_SECONDS:
            raise errors.InvalidInput(
                f"setting order_wait_seconds: must be between 0 and {MAX_ORDER_WAIT_SECONDS:g}, "
                f"got {self.order_wait_seconds!r}"
            )
        if self.token_cache_seconds > MAX_CACHE_SECONDS:
            raise errors.InvalidInput(
                f"setting token_cache_seconds: must be between 0 and {MAX_CACHE_SECONDS:g}, "
                f"got {self.token_cache_seconds!r}"
            )
        for name, value in _numbers(self):
            if name.startswith(("mcp_", "ui_")) and not 1 <= value <= AT_MOST.get(name, value):
                most = AT_MOST.get(name)
                within = f"between 1 and {most}" if most else "at least 1"
                raise errors.InvalidInput(f"setting {name}: must be {within}, got {value!r}")
        for name, value in _numbers(self):
            if name == "embed_nice":
                if not 0 <= value <= 19:
                    raise errors.InvalidInput(f"setting {name}: must be 0 to 19, got {value!r}")
            elif name in ("embed_cache_bytes", "embed_exact_below"):
                pass  # 0: no cache, or always a shortlist (a negative value is refused)
            elif name.startswith(("search_", "embed_")) and not value > 0:
                raise errors.InvalidInput(f"setting {name}: must be above 0, got {value!r}")
        if self.embed.rerank < self.search.candidates:
            raise errors.InvalidInput(
                f"setting embed_rerank: must be at least search_candidates "
                f"({self.search.candidates}), got {self.embed.rerank!r}"
            )
        if self.search.embedder not in EMBEDDERS:
            raise errors.InvalidInput(
                f"setting search_embedder: must be one of {', '.join(EMBEDDERS)}, "
                f"got {self.search.embedder!r}"
            )
        if self.search.embedder == "openai" and not (self.embed.url and self.embed.model):
            raise errors.InvalidInput(
                "search_embedder: openai needs embed_url (the endpoint, up to /v1) and embed_model"
            )
        if not self.file_locks and not _is_postgres_url(self.database_url):
            raise errors.InvalidInput(
                "file_locks: false needs PostgreSQL (database_url): its advisory locks are "
                "then all that keeps two processes from writing one file at once"
            )


def keys() -> list[str]:
    """Every flat settings key."""
    found = sorted(_TOP)
    for prefix, (_, group) in GROUPS.items():
        found += [f"{prefix}_{f.name}" for f in dataclasses.fields(group)]
    return found


def hermes_home(environ: Mapping[str, str] | None = None) -> Path:
    """Hermes Agent's home, where ``sgme hermes install`` puts the provider, by Hermes' own
    rule (``hermes_constants.get_hermes_home``): ``$HERMES_HOME`` as given, else ``~/.hermes``
    (``%LOCALAPPDATA%\\hermes`` on Windows). Not a setting of ours: it is Hermes' variable,
    read here because this is the module that reads the environment."""
    env = os.environ if environ is None else environ
    found = env.get("HERMES_HOME", "").strip()
    if found:
        return Path(found)
    if sys.platform == "win32":
        local = env.get("LOCALAPPDATA", "").strip()
        return (Path(local) if local else Path.home() / "AppData" / "Local") / "hermes"
    return Path.home() / ".hermes"


@dataclasses.dataclass(frozen=True)
class Remote:
    """How a command that is a client of the HTTP API (``sgme mcp``) reaches its server:
    ``SGME_URL`` (default :data:`remote.DEFAULT_URL <pipeline.remote.DEFAULT_URL>`),
    ``SGME_TOKEN`` and ``SGME_AGENT_ID``, as :mod:`pipeline.remote` reads them. Not settings
    of a server: they name the server and who the client is."""

    url: str
    token: str | None
    agent_id: str

    @classmethod
    def load(cls, *, agent_id: str, environ: Mapping[str, str] | None = None) -> Remote:
        """From the environment; ``agent_id`` is the default when ``SGME_AGENT_ID`` is unset."""
        env = os.environ if environ is None else environ
        return cls(
            url=remote.url(env), token=remote.token(env), agent_id=remote.agent_id(env, agent_id)
        )


_TOP = {f.name for f in dataclasses.fields(Settings)} - {a for a, _ in GROUPS.values()}


def _is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql:", "postgresql+", "postgres:"))


def _types(cls: type[Any]) -> dict[str, Any]:
    """The resolved type of each field of a settings dataclass."""
    return typing.get_type_hints(cls)


def _numbers(settings: Settings) -> list[tuple[str, float]]:
    """Every numeric setting, by its flat key."""
    found: list[tuple[str, float]] = []
    for name in _TOP:
        value = getattr(settings, name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found.append((name, value))
    for prefix, (attribute, group) in GROUPS.items():
        for f in dataclasses.fields(group):
            value = getattr(getattr(settings, attribute), f.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found.append((f"{prefix}_{f.name}", value))
    return found


def _flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """A YAML mapping whose groups may be nested (``limits: {…}``) as flat keys."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in GROUPS and isinstance(value, Mapping):
            flat.update({f"{key}_{name}": item for name, item in value.items()})
        else:
            flat[str(key)] = value
    return flat


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _convert(name: str, raw: Any, kind: Any) -> Any:
    """A settings value from YAML or the environment, as its setting's type."""
    try:
        if kind is Path:
            return Path(raw)
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError(f"not a boolean (one of {', '.join(_TRUE + _FALSE)})")
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError("not a whole number")
            try:
                return int(raw) if isinstance(raw, int | float) else int(str(raw).strip())
            except ValueError:
                raise ValueError("not a whole number") from None
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError("not a number")
            value = float(raw)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError("not a finite number")
            return value
        if typing.get_origin(kind) is tuple:
            items = raw.split(",") if isinstance(raw, str) else list(raw or ())
            return tuple(str(item).strip() for item in items if str(item).strip())
        if typing.get_origin(kind) is dict:
            value = yaml.safe_load(raw) if isinstance(raw, str) else raw
            if value is not None and not isinstance(value, Mapping):
                raise ValueError("not a mapping")
            return dict(value or {})
        if isinstance(raw, Mapping | list):
            raise ValueError("not a single value")
        return str(raw)
    except (TypeError, ValueError, yaml.YAMLError) as exc:
        raise errors.InvalidInput(f"setting {name}: bad value {raw!r} ({exc})") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise errors.InvalidInput(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise errors.InvalidInput(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise errors.InvalidInput(f"config file {path} must hold a mapping")
    return data
