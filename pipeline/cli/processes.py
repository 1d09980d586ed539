"""The long-running processes: ``serve`` (embedded), ``api``, ``worker``, ``beat``."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import errors
from pipeline.cli.context import Add, Context

if TYPE_CHECKING:
    from pipeline.settings import Settings


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_bind(settings: Settings) -> None:
    """A network address only with auth on: anyone who can reach the port could otherwise read
    and write every agent's memory. Read-only, before anything is created or migrated."""
    from pipeline import auth, database

    if _is_loopback(settings.host) or settings.require_auth:
        return
    url = settings.index_url
    # A SQLite index that does not exist yet has no tokens (and a refusal creates nothing).
    if not url.startswith("sqlite:///") or Path(url.removeprefix("sqlite:///")).exists():
        db = database.Database.from_url(
            url, busy_timeout=settings.sqlite_busy_timeout, create=False
        )
        try:
            if auth.made_any(db):
                return
        finally:
            db.dispose()
    raise errors.InvalidInput(
        f"refusing to listen on {settings.host}: authentication is off (no token exists), so "
        "the server binds loopback addresses only (127.0.0.1, ::1, localhost). Create a token "
        "first: `sgme migrate`, then `sgme token create --agent-id '*' --scope admin --name ops` "
        "(with the same --data-dir/--database-url); or set require_auth: true "
        "(SGME_REQUIRE_AUTH=true)"
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(0)


def cmd_serve(ctx: Context) -> int:
    """API + an in-process worker and beat on the in-memory broker (the embedded default)."""
    from pipeline.api import app as api_app
    from pipeline.api import server

    a = ctx.args
    settings = ctx.settings(host=a.host, port=a.port, broker_url=a.broker_url)
    _check_bind(settings)
    runtime = ctx.runtime(settings, migrate=True)
    with runtime.workers.embedded(runtime, concurrency=a.concurrency) as service:
        app = api_app.create_app(service)
        print(
            f"sgme: data in {settings.data_dir.resolve()}, index {settings.index_url}, "
            f"broker {settings.broker_url}",
            file=sys.stderr,
        )
        # uvicorn shuts down gracefully on SIGTERM and then raises the signal again; with the
        # default handler that kills the process before the embedded worker and beat are
        # stopped (the task in progress dies with it). SystemExit instead runs the cleanup.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        server.run(app, settings, log_level=a.log_level)
    return 0


def cmd_api(ctx: Context) -> int:
    """The API alone; work goes to the workers through the broker."""
    from pipeline.api import app as api_app
    from pipeline.api import server

    a = ctx.args
    settings = ctx.settings(host=a.host, port=a.port, broker_url=a.broker_url)
    _check_bind(settings)
    runtime = ctx.runtime(settings)
    if a.workers > 1:
        ctx.close()  # each process opens its own
        _hand_down(ctx, settings)
        server.run_processes(settings, processes=a.workers, log_level=a.log_level)
        return 0
    app = api_app.create_app(runtime.workers.service(runtime))
    server.run(app, settings, log_level=a.log_level)
    return 0


def _hand_down(ctx: Context, settings: Settings) -> None:
    """Put the settings the flags changed where the API processes read them: the
    environment (the config file and ``SGME_*`` variables they read anyway)."""
    a = ctx.args
    if a.config:
        os.environ["SGME_CONFIG"] = str(Path(a.config).resolve())
    os.environ["SGME_DATA_DIR"] = str(settings.data_dir.resolve())
    os.environ["SGME_DATABASE_URL"] = settings.database_url
    os.environ["SGME_BROKER_URL"] = settings.broker_url
    os.environ["SGME_HOST"] = settings.host
    os.environ["SGME_PORT"] = str(settings.port)


def cmd_worker(ctx: Context) -> int:
    """A Celery worker in the foreground."""
    from pipeline.runtime import long_running

    a = ctx.args
    settings = ctx.settings(broker_url=a.broker_url)
    runtime = ctx.runtime(settings)
    long_running()
    runtime.workers.worker(
        runtime,
        queues=a.queues,
        concurrency=a.concurrency,
        pool=a.pool,
        loglevel=a.log_level,
    )
    return 0


def cmd_beat(ctx: Context) -> int:
    """The Celery beat scheduler in the foreground (exactly one per deployment)."""
    from pipeline.runtime import long_running

    a = ctx.args
    settings = ctx.settings(broker_url=a.broker_url)
    runtime = ctx.runtime(settings)
    long_running()
    runtime.workers.beat(runtime, loglevel=a.log_level)
    return 0


def register(add: Add) -> None:
    """Declare the process commands."""
    p: argparse.ArgumentParser
    for name, func, text in (
        ("serve", cmd_serve, "run the API with an in-process worker and beat (embedded)"),
        ("api", cmd_api, "run the API only; work goes to Celery workers via the broker"),
    ):
        p = add(name, func, text)
        p.add_argument("--host", help="address to bind (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="port (env SGME_PORT, default 8765)")
        p.add_argument("--broker-url", help="Celery broker (env SGME_BROKER_URL)")
        p.add_argument("--log-level", default="info", help=_LOG_LEVEL)
        if name == "serve":
            p.add_argument("--concurrency", type=int, default=4, help="worker threads")
        else:
            p.add_argument(
                "--workers",
                type=_positive,
                default=1,
                help="API processes sharing the port (default 1); each opens its own index "
                "and broker connections",
            )
    p = add("worker", cmd_worker, "run a Celery worker (production)")
    p.add_argument("--broker-url", help="Celery broker (env SGME_BROKER_URL)")
    p.add_argument(
        "--queues",
        default="append,refine,archive,embed",
        help="comma-separated queues to consume (default all: append,refine,archive,embed)",
    )
    p.add_argument("--concurrency", type=int, default=2, help="worker processes (default 2)")
    p.add_argument(
        "--pool",
        default="prefork",
        choices=["prefork", "threads", "solo"],
        help="Celery's execution pool (default prefork)",
    )
    p.add_argument("--log-level", default="info", help=_LOG_LEVEL)
    p = add("beat", cmd_beat, "run the Celery beat scheduler (exactly one per deployment)")
    p.add_argument("--broker-url", help="Celery broker (env SGME_BROKER_URL)")
    p.add_argument("--log-level", default="info", help=_LOG_LEVEL)


_LOG_LEVEL = "debug, info (default), warning or error"
