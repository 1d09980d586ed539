"""One frozen Settings, read from a YAML file, then ``SGME_*`` environment variables, then
explicit overrides (CLI flags). This is the only module that reads the environment.

Precedence, lowest first: the defaults (each in one place: the field below, or the option
group's dataclass — :class:`refine.Options`, :class:`archive.Options`,
:class:`validation.Limits`), the file named by ``SGME_CONFIG`` (or passed in), environment
variables, keyword overrides. Every key is flat (``refine_min_messages``,
``limits_max_session_key``, env ``SGME_REFINE_MIN_MESSAGES``); a YAML file may also nest a
group (``limits: {max_session_key: 512}``). ``config/default.yaml`` documents each one.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline import archive, auth, database, errors, journal, ordering, refine, store, validation


@dataclasses.dataclass(frozen=True)
class Http:
    """The HTTP server's bounds (``http_*`` settings; docs/operations.md says what a client
    gets at each)."""

    #: a request body larger than this is refused with 413 before any of it is parsed (from
    #: Content-Length, or counted as a chunked body arrives); above the 32 MiB append limit,
    #: as JSON escaping makes a body larger than its content
    max_request_bytes: int = 64 * 1024 * 1024
    body_timeout: float = 120.0  #: seconds for a whole request body to arrive (then 408)
    header_timeout: float = 30.0  #: seconds for a request head to arrive (then closed)
    keepalive_timeout: float = 5.0  #: seconds an idle keep-alive connection is kept
    #: open connections at most; the oldest idle one is closed to make room for a new one
    max_connections: int = 4096
    #: bytes of messages (their blocks in the file) one page of ``/messages`` or one ref's
    #: neighbours hold at most; one message always comes, however large
    max_page_bytes: int = 16 * 1024 * 1024


DEFAULT_HTTP = Http()

#: option groups: settings key prefix → (Settings field, the group's frozen dataclass)
GROUPS: dict[str, tuple[str, type[Any]]] = {
    "refine": ("refinement", refine.Options),
    "archive": ("archiving", archive.Options),
    "limits": ("limits", validation.Limits),
    "http": ("http", Http),
    "backlog": ("backlog", journal.Backlog),
}
#: fields of a group that come from a top-level setting instead of a key of their own
_SHARED = {
    ("archive", "lock_timeout"): "lock_timeout",
    ("archive", "file_locks"): "file_locks",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything configurable; see ``config/default.yaml`` for each value's meaning."""

    data_dir: Path = Path("data")
    database_url: str = ""
    broker_url: str = "memory://"
    host: str = "127.0.0.1"
    port: int = 8765
    lock_timeout: float = store.DEFAULT_LOCK_TIMEOUT
    #: per-file lock files (``flock``) on the data volume; off only with PostgreSQL, whose
    #: advisory locks then keep processes on several hosts off one file (a networked volume
    #: where ``flock`` cannot be trusted: docs/scaling.md)
    file_locks: bool = True
    sweep_interval: float = 5.0  #: seconds between sweeps for un-flushed journal rows
    sweep_age: float = 3.0  #: seconds a journal row may wait before the sweeper re-kicks it
    #: seconds numbered appends (``sequence``) that came over Celery wait for a missing
    #: predecessor before they are written without it (the gap recorded: pipeline.ordering)
    order_wait_seconds: float = ordering.DEFAULT_WAIT_SECONDS
    sqlite_busy_timeout: float = database.DEFAULT_BUSY_TIMEOUT
    sqlite_synchronous: str = database.DEFAULT_SQLITE_SYNCHRONOUS
    #: Celery retries of flushes and ``sgme.append`` tasks (lock timeouts, a busy database)
    flush_max_retries: int = 8
    flush_retry_backoff: int = 1  #: seconds before the first retry (doubles, with jitter)
    #: every /v1/* endpoint but /v1/health needs a bearer token even before any token exists
    #: (once one was made, they need one anyway); lets ``serve``/``api`` bind a network address
    require_auth: bool = False
    #: Host header names the API answers to, besides the address it binds; any other is a 400
    #: (what a DNS-rebinding page sends). "*" allows any: only behind a proxy that checks Host
    allowed_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
    metrics_require_auth: bool = False  #: ``/metrics`` needs an admin token
    #: seconds an API process trusts what it read about a token (at most 60): a token made or
    #: revoked by ``sgme token`` takes effect in running servers within this time
    token_cache_seconds: float = auth.DEFAULT_CACHE_SECONDS
    #: replace credentials of well-known forms by ``[REDACTED:<kind>]`` before an append is
    #: acknowledged (docs/privacy.md); an agent may be given its own choice by an admin
    redact_secrets: bool = True
    refinement: refine.Options = refine.DEFAULT_OPTIONS
    refiner: str = "builtin"  #: entry point name in group ``sgme.refiners``
    #: refiner options, e.g. {base_url, model, api_key, timeout} for openai, {url} for webhook
    refiner_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    archiving: archive.Options = archive.DEFAULT_OPTIONS
    #: worker side: expose Prometheus metrics on this port (0: off)
    worker_metrics_port: int = 0
    limits: validation.Limits = validation.DEFAULT_LIMITS
    http: Http = DEFAULT_HTTP
    backlog: journal.Backlog = journal.DEFAULT_BACKLOG

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
        known = _keys()
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
        for name, raw in values.items():
            prefix, _, field = name.partition("_")
            if prefix in GROUPS and name not in _TOP:
                groups[prefix][field] = _convert(name, raw, getattr(GROUPS[prefix][1], field))
            else:
                kwargs[name] = _convert(name, raw, getattr(cls, name, None))
        for (prefix, field), source in _SHARED.items():
            groups[prefix][field] = kwargs.get(source, getattr(cls, source))
        for prefix, (attribute, group) in GROUPS.items():
            if groups[prefix]:
                kwargs[attribute] = group(**groups[prefix])
        if not kwargs.get("file_locks", True) and not database.is_postgres_url(
            kwargs.get("database_url", "")
        ):
            raise errors.InvalidInput(
                "file_locks: false needs PostgreSQL (database_url): its advisory locks are "
                "then all that keeps two processes from writing one file at once"
            )
        wait = kwargs.get("order_wait_seconds", 0.0)
        if not 0 <= wait <= ordering.MAX_WAIT_SECONDS:
            raise errors.InvalidInput(
                f"order_wait_seconds must be between 0 and {ordering.MAX_WAIT_SECONDS:g}, "
                f"got {wait!r}"
            )
        return cls(**kwargs)


_TOP = {f.name for f in dataclasses.fields(Settings)} - {a for a, _ in GROUPS.values()}


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


def _keys() -> list[str]:
    """Every flat settings key."""
    keys = sorted(_TOP)
    for prefix, (_, group) in GROUPS.items():
        keys += [
            f"{prefix}_{f.name}"
            for f in dataclasses.fields(group)
            if (prefix, f.name) not in _SHARED
        ]
    return keys


def _flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """A YAML mapping whose groups may be nested (``limits: {…}``) as flat keys."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in GROUPS and isinstance(value, Mapping):
            flat.update({f"{key}_{name}": item for name, item in value.items()})
        else:
            flat[str(key)] = value
    return flat


def _convert(name: str, raw: Any, default: Any) -> Any:
    """A settings value from YAML or the environment, as the type of its default."""
    try:
        if name == "refiner_options":
            value = yaml.safe_load(raw) if isinstance(raw, str) else raw
            return dict(value or {})
        if name == "data_dir":
            return Path(raw)
        if isinstance(default, tuple):
            items = raw.split(",") if isinstance(raw, str) else list(raw or ())
            return tuple(str(item).strip() for item in items if str(item).strip())
        if isinstance(default, bool):
            return str(raw).lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
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
