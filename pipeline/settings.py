"""One frozen Settings, read from a YAML file, then ``SGME_*`` environment variables, then
explicit overrides (CLI flags). This is the only module that reads the environment.

Precedence, lowest first: the defaults below (mirrored in ``config/default.yaml``), the file
named by ``SGME_CONFIG`` (or passed in), environment variables, keyword overrides.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline import document, errors

DEFAULT_DATA_DIR = "data"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_LOCK_TIMEOUT = 30.0  #: seconds a flush waits for its per-file lock
DEFAULT_SWEEP_INTERVAL = 5.0  #: seconds between sweeps for un-flushed journal rows
DEFAULT_SWEEP_AGE = 3.0  #: seconds a journal row may wait before the sweeper re-kicks it
DEFAULT_SQLITE_BUSY_TIMEOUT = 30.0  #: seconds SQLite waits for a lock before failing
DEFAULT_REFINE_MIN_MESSAGES = 20  #: new messages that make a file due for refinement at once
DEFAULT_REFINE_IDLE_SECONDS = 60.0  #: quiet seconds after which fewer new messages are due
DEFAULT_REFINE_LEASE_SECONDS = 600.0  #: how long a claimed segment is reserved for its job
DEFAULT_REFINE_MAX_RETRIES = 5  #: attempts after the first before a file is marked error
DEFAULT_REFINE_WINDOW_TOKENS = 6000  #: refiner context budget per window (estimated tokens)
DEFAULT_REFINE_OVERLAP_MESSAGES = 1  #: messages repeated from the previous window


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything configurable; see ``config/default.yaml`` for each value's meaning."""

    data_dir: Path = Path(DEFAULT_DATA_DIR)
    database_url: str = ""
    broker_url: str = "memory://"
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL
    sweep_age: float = DEFAULT_SWEEP_AGE
    sqlite_busy_timeout: float = DEFAULT_SQLITE_BUSY_TIMEOUT
    #: allow binding a non-loopback address although there is no authentication yet; only
    #: for networks where every client is trusted (a compose network published on 127.0.0.1)
    trust_network: bool = False
    #: refinement (DESIGN §4)
    refine_min_messages: int = DEFAULT_REFINE_MIN_MESSAGES
    refine_idle_seconds: float = DEFAULT_REFINE_IDLE_SECONDS
    refine_lease_seconds: float = DEFAULT_REFINE_LEASE_SECONDS
    refine_max_retries: int = DEFAULT_REFINE_MAX_RETRIES
    refine_retry_backoff: float = 2.0  #: seconds before the first retry; doubles each time
    refine_window_tokens: int = DEFAULT_REFINE_WINDOW_TOKENS
    refine_overlap_messages: int = DEFAULT_REFINE_OVERLAP_MESSAGES
    refine_dispatch_interval: float = 5.0  #: seconds between beat dispatches
    refiner: str = "builtin"  #: entry point name in group ``sgme.refiners``
    #: refiner options, e.g. {base_url, model, api_key, timeout} for openai, {url} for webhook
    refiner_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: cold archive (DESIGN §5): days unchanged before a fully refined file is compressed
    archive_after_days: float = 90.0
    archive_level: int = 10  #: zstd level
    archive_threads: int = 0  #: zstd worker threads per file (0: on the calling thread)
    archive_workers: int = 2  #: files compressed at once
    #: worker side: expose Prometheus metrics on this port (0: off)
    worker_metrics_port: int = 0
    limits: document.Limits = document.DEFAULT_LIMITS

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
            values.update(_read_yaml(Path(path)))
        for field in dataclasses.fields(cls):
            key = f"SGME_{field.name.upper()}"
            if key in env and field.name not in ("limits",):
                values[field.name] = env[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls._build(values)

    @classmethod
    def _build(cls, values: dict[str, Any]) -> Settings:
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise errors.InvalidInput(f"unknown settings: {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        for name, raw in values.items():
            default = getattr(cls, name, None)
            try:
                if name == "refiner_options":
                    kwargs[name] = dict(yaml.safe_load(raw) if isinstance(raw, str) else raw)
                elif name == "limits":
                    kwargs[name] = dataclasses.replace(document.DEFAULT_LIMITS, **dict(raw))
                elif name == "data_dir":
                    kwargs[name] = Path(raw)
                elif isinstance(default, bool):
                    kwargs[name] = str(raw).lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    kwargs[name] = int(raw)
                elif isinstance(default, float):
                    kwargs[name] = float(raw)
                else:
                    kwargs[name] = str(raw)
            except (TypeError, ValueError) as exc:
                raise errors.InvalidInput(f"setting {name}: bad value {raw!r} ({exc})") from None
        return cls(**kwargs)


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
