"""What every ``sgme`` command shares: its :class:`Context` (the arguments, and the runtime
built from them), exit codes, JSON output and progress bars."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    # Imported where they are used: ``sgme capture`` runs inside an agent's hook, with a
    # budget of about a second, and must not pay for the runtime (the index, the service).
    from pipeline.runtime import Runtime, Workers
    from pipeline.service import Queue, Service
    from pipeline.settings import Settings

EXIT_PROBLEMS = 1
EXIT_ERROR = 2

Command = Callable[["Context"], int]


class Add(Protocol):
    """Declares a subcommand; ``common=False`` leaves out ``--data-dir``, ``--database-url``
    and ``--config`` (a command that works on neither the data directory nor the index)."""

    def __call__(
        self, name: str, func: Command, text: str, *, common: bool = True
    ) -> argparse.ArgumentParser: ...


class Context:
    """A command's arguments and the runtime it builds from them, on first use."""

    def __init__(self, args: argparse.Namespace, workers: Workers | None = None) -> None:
        self.args = args
        self._workers = workers
        self._runtimes: list[Runtime] = []

    def settings(self, **extra: Any) -> Settings:
        """Settings from the config file, the environment and the common flags."""
        from pipeline.settings import Settings

        a = self.args
        return Settings.load(
            getattr(a, "config", None),
            data_dir=getattr(a, "data_dir", None),
            database_url=getattr(a, "database_url", None),
            **extra,
        )

    def runtime(self, settings: Settings, *, migrate: bool = False) -> Runtime:
        """The runtime over ``settings`` (:meth:`Runtime.open`): with ``migrate`` the store is
        created or brought up to date; otherwise it must exist at the schema the code needs
        (nothing is created, and the error says where it looked and what to run)."""
        from pipeline.runtime import Runtime

        runtime = Runtime.open(settings, migrate=migrate, workers=self._workers)
        self._runtimes.append(runtime)
        return runtime

    def service(self, settings: Settings, queue: Queue | None = None) -> Service:
        """A service over the store of ``settings``; without a queue nothing is enqueued or
        claimed."""
        return self.runtime(settings).service(queue)

    def close(self) -> None:
        """Close the runtimes' pooled connections (pooled psycopg connections left to the
        garbage collector raise ResourceWarning)."""
        while self._runtimes:
            self._runtimes.pop().close()


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
