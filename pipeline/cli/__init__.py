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
import logging
import os
import sys
from typing import TYPE_CHECKING

from pipeline import errors
from pipeline.cli.context import EXIT_ERROR, EXIT_PROBLEMS, Command, Context

if TYPE_CHECKING:
    # Only named here: ``sgme capture`` runs inside an agent's hook, with a budget of about a
    # second, and must not pay for the runtime (the index, the service) at start.
    from pipeline.runtime import Workers

__all__ = ["EXIT_ERROR", "EXIT_PROBLEMS", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``sgme`` argument parser."""
    from pipeline.cli import (
        agents,
        browse,
        capture,
        files,
        hermes,
        imports,
        maintenance,
        privacy,
        processes,
        searching,
        secrets,
        tokens,
    )

    common_options = argparse.ArgumentParser(add_help=False)
    common_options.add_argument(
        "--data-dir", help="data directory (env SGME_DATA_DIR, default ./data)"
    )
    common_options.add_argument(
        "--database-url",
        help="index database URL (env SGME_DATABASE_URL, default SQLite in the data dir)",
    )
    common_options.add_argument("--config", help="YAML settings file (env SGME_CONFIG)")

    parser = argparse.ArgumentParser(prog="sgme", description="SGME L0: the raw layer.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Command, text: str, *, common: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common_options] if common else [], help=text)
        p.description = text
        p.set_defaults(func=func)
        return p

    modules = (processes, files, browse, searching, imports, hermes, capture, maintenance, privacy)
    for module in (*modules, secrets, tokens, agents):
        module.register(add)
    return parser


def main(argv: list[str] | None = None, *, workers: Workers | None = None) -> int:
    """Entry point of the ``sgme`` console script; ``workers`` replaces the task queue
    backend the entry point names (tests hand one in)."""
    if (sys.argv[1:] if argv is None else argv)[:1] == ["capture"]:
        # a hook's run: no other command's modules are imported (see the TYPE_CHECKING note)
        from pipeline.cli import capture

        return capture.main((sys.argv[1:] if argv is None else argv)[1:])
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
        code = int(args.func(ctx))
        sys.stdout.flush()  # here, so that a reader gone by now is met below
        return code
    except BrokenPipeError:
        return _reader_gone()
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


#: what a command whose reader went away exits with: as a Unix tool killed by SIGPIPE (13)
EXIT_READER_GONE = 128 + 13


def _reader_gone() -> int:
    """The reader of our output closed it (``sgme search --json | head``): stop quietly, as
    Unix tools do, and keep the interpreter's last flush of stdout from saying so too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_READER_GONE
