"""The ``sgme`` command.

Every command takes ``--data-dir`` (env ``SGME_DATA_DIR``, default ``./data``),
``--database-url`` (env ``SGME_DATABASE_URL``, default a SQLite file in the data dir) and
``--config`` (env ``SGME_CONFIG``). Errors print one line to stderr and exit 2; ``fsck``
exits 1 when it finds a problem. Only ``migrate`` and ``serve`` change the index schema; every
other command refuses to work on a schema that is behind and says what to run.

The commands live in modules by what they are for (``processes``, ``files``,
``maintenance``, ``tokens``); each has a ``register(add)`` that declares its subcommands.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import sys
from collections.abc import Callable, Iterator
from importlib import metadata as importlib_metadata
from typing import Any

import sqlalchemy as sa

from pipeline import database, errors
from pipeline.service import Queue, Service, Workers
from pipeline.settings import Settings

EXIT_PROBLEMS = 1
EXIT_ERROR = 2
WORKERS_GROUP = "sgme.workers"  #: the entry point group that names the task queue backend

Command = Callable[["Context"], int]
Add = Callable[[str, Command, str], argparse.ArgumentParser]


class Context:
    """A command's arguments and what it builds from them, made on first use."""

    def __init__(self, args: argparse.Namespace, workers: Workers | None = None) -> None:
        self.args = args
        self._workers = workers
        self._engines: list[sa.Engine] = []

    def settings(self, **extra: Any) -> Settings:
        """Settings from the config file, the environment and the common flags."""
        a = self.args
        return Settings.load(a.config, data_dir=a.data_dir, database_url=a.database_url, **extra)

    def engine(self, settings: Settings, *, migrate: bool = False) -> sa.Engine:
        """The index engine: migrated to the newest schema (``migrate``) or checked to be at
        it (every other command: nothing is changed, and the message says what to run)."""
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = database.create_engine(
            settings.index_url,
            busy_timeout=settings.sqlite_busy_timeout,
            synchronous=settings.sqlite_synchronous,
        )
        self._engines.append(engine)
        if migrate:
            database.migrate(engine, data_dir=settings.data_dir)
        else:
            database.check_schema(engine)
        return engine

    def service(self, settings: Settings, queue: Queue | None = None) -> Service:
        """A service over a checked engine; without a queue nothing is enqueued or claimed."""
        return Service(settings, self.engine(settings), queue)

    @functools.cached_property
    def workers(self) -> Workers:
        """The task queue backend (the ``sgme.workers`` entry point, or the one given)."""
        if self._workers is not None:
            return self._workers
        found = importlib_metadata.entry_points(group=WORKERS_GROUP, name="celery")
        if not found:
            raise errors.Misconfigured(
                f"no task queue backend is installed (entry point group {WORKERS_GROUP})"
            )
        backend: Workers = next(iter(found)).load()
        return backend

    def close(self) -> None:
        """Dispose of the engines (pooled psycopg connections left to the garbage collector
        raise ResourceWarning)."""
        while self._engines:
            self._engines.pop().dispose()


def print_json(value: Any) -> None:
    """Pretty JSON on stdout, for scripts."""
    json.dump(value, sys.stdout, ensure_ascii=False, indent=2)
    sys.stdout.write("\n")


@contextlib.contextmanager
def progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr when it is a terminal; silent otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def build_parser() -> argparse.ArgumentParser:
    """The ``sgme`` argument parser."""
    from pipeline.cli import (
        files,
        hermes,
        imports,
        maintenance,
        privacy,
        processes,
        searching,
        tokens,
    )

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", help="data directory (env SGME_DATA_DIR, default ./data)")
    common.add_argument(
        "--database-url",
        help="index database URL (env SGME_DATABASE_URL, default SQLite in the data dir)",
    )
    common.add_argument("--config", help="YAML settings file (env SGME_CONFIG)")

    parser = argparse.ArgumentParser(prog="sgme", description="SGME L0: the raw layer.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Command, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=func)
        return p

    for module in (processes, files, searching, imports, hermes, maintenance, privacy, tokens):
        module.register(add)
    return parser


def main(argv: list[str] | None = None, *, workers: Workers | None = None) -> int:
    """Entry point of the ``sgme`` console script; ``workers`` replaces the task queue
    backend the entry point names (tests hand one in)."""
    args = build_parser().parse_args(argv)
    level = str(getattr(args, "log_level", "info")).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One log line per task is Flower's job; keep the console for warnings unless asked.
    if level != "DEBUG":
        logging.getLogger("celery").setLevel(logging.WARNING)
        # Alembic tells at INFO how it talks to the database, at every schema check.
        logging.getLogger("alembic").setLevel(logging.WARNING)
    ctx = Context(args, workers)
    try:
        return int(args.func(ctx))
    except errors.SgmeError as exc:
        # One line, even when the detail quotes a multi-line message (a YAML parser's).
        detail = " ".join(line.strip() for line in exc.detail.splitlines() if line.strip())
        print(f"sgme {args.command}: {detail}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"sgme {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    finally:
        ctx.close()
