"""``sgme hermes install``: put the Hermes Agent memory provider where Hermes finds user
plugins, ``$HERMES_HOME/plugins/sgme/``, and say how to turn it on.

The provider's files come with this package: an installed wheel carries a copy in
``pipeline/hermes-provider/`` (made by ``setup.py`` at build time); a checkout or an editable
install reads ``integrations/hermes/sgme/`` itself. Three of its modules are this package's
own, copied as they are rather than kept twice: the tool-call convention and the conversion of
OpenAI-style messages (``pipeline/importers/convention.py`` and ``chat.py``, so the provider
writes and keys turns exactly as the importer does) and the spool
(``pipeline/capture/spool.py``), and the secret rules the spool redacts its turns with
(``pipeline/redactor.py``, with the modules and the formats file it reads). They use the
standard library only (``chat.py`` and the secret rules import their siblings relatively;
the rules search their keywords without the automaton there), because the provider runs
inside Hermes' environment, where this package is not.

An existing ``plugins/sgme`` is replaced whole when it holds only the provider's files (of
this version or an earlier one); anything else in it is not deleted without asking: the
command asks on a terminal and otherwise stops, unless ``--force``.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import shlex
import shutil
import sys
import uuid
from importlib.resources.abc import Traversable
from pathlib import Path

import pipeline
from pipeline import errors
from pipeline.cli.context import Add, Context

PLUGIN_NAME = "sgme"  #: the directory under plugins/, and ``memory.provider``'s value
PACKAGED = "hermes-provider"  #: the copy inside an installed ``pipeline`` package
CHECKOUT = Path(pipeline.__file__).resolve().parent.parent / "integrations" / "hermes" / "sgme"
SUFFIXES = (".py", ".yaml")  #: the provider's files (setup.py copies the same)
#: this package's modules the provider uses, copied beside its own files under these names
SHARED = {
    "convention.py": "pipeline",
    "chat.py": "pipeline.importers",
    "spool.py": "pipeline.capture",
    "redactor.py": "pipeline",
    "assignment.py": "pipeline",
    "literal.py": "pipeline",
    "secret_formats.toml": "pipeline",
}
#: what an install of this or an earlier version leaves in plugins/sgme (replaced freely)
OURS = {"__init__.py", "messages.py", "recall.py", "sender.py", "plugin.yaml", *SHARED}
OURS_DIRS = {"__pycache__"}


def provider_files() -> list[Traversable]:
    """The provider's files: the installed copy, else the checkout's source; and the shared
    modules from this package."""
    shared = [importlib.resources.files(package) / name for name, package in SHARED.items()]
    for where in (importlib.resources.files(pipeline) / PACKAGED, CHECKOUT):
        if where.is_dir():
            found = [f for f in where.iterdir() if f.is_file() and f.name.endswith(SUFFIXES)]
            if any(f.name == "__init__.py" for f in found):
                return sorted([*found, *shared], key=lambda f: f.name)
    raise errors.Misconfigured(
        "the Hermes provider's files are not part of this installation (looked in the "
        f"package's {PACKAGED}/ and in {CHECKOUT}): reinstall sgme-l0 from a wheel or a "
        "checkout"
    )


def foreign(target: Path) -> list[str]:
    """What ``target`` holds that no install of the provider put there (sorted names)."""
    if target.is_symlink() or not target.is_dir():
        return []
    return sorted(
        p.name
        for p in target.iterdir()
        if not (p.name in OURS_DIRS and p.is_dir()) and not (p.name in OURS and p.is_file())
    )


def install(home: Path) -> Path:
    """Copy the provider to ``home/plugins/sgme/``, replacing an earlier install whole; the
    directory it made. The files are written to a hidden directory beside it first (Hermes
    skips names starting with a dot), then renamed into place, so Hermes never loads half.
    The caller has made sure nothing of the user's is in the way (:func:`foreign`)."""
    files = provider_files()
    plugins = home / "plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    target = plugins / PLUGIN_NAME
    staging = plugins / f".{PLUGIN_NAME}-install-{uuid.uuid4().hex}"
    old = plugins / f".{PLUGIN_NAME}-old-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        for source in files:
            (staging / source.name).write_bytes(source.read_bytes())
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            os.replace(target, old)  # aside, and removed once the new one is in place
        try:
            os.replace(staging, target)
        except OSError:
            if old.exists():
                os.replace(old, target)  # the earlier install back, rather than none
            raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(old)
    return target


def _may_replace(target: Path, *, force: bool) -> None:
    """Stop unless ``target`` holds only the provider's files, the user said so (``--force``)
    or, on a terminal, agrees."""
    others = foreign(target)
    if not others or force:
        return
    listed = ", ".join(repr(name) for name in others[:5]) + (" …" if len(others) > 5 else "")
    question = f"{target} also holds {listed}, which an install replaces. Replace it all?"
    if sys.stdin.isatty() and sys.stderr.isatty():
        print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip().lower() in ("y", "yes"):
            return
        raise errors.Conflict(f"nothing installed: {target} was left as it is")
    raise errors.Conflict(
        f"{target} holds files that are not the provider's ({listed}): move them away, or run "
        "again with --force to replace the directory whole"
    )


def cmd_install(ctx: Context) -> int:
    """Install the provider into a Hermes home and print how to enable and configure it."""
    from pipeline import settings

    given = ctx.args.hermes_home
    home = Path(given) if given else settings.hermes_home()
    s = ctx.settings()  # for the URL to suggest; a bad config stops before anything is copied
    _may_replace(home / "plugins" / PLUGIN_NAME, force=ctx.args.force)
    target = install(home)
    # `hermes` itself must look in the same home: say so when it is not its default
    prefix = f"HERMES_HOME={shlex.quote(str(home))} " if given else ""
    host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host
    url = f"http://{f'[{host}]' if ':' in host else host}:{s.port}"
    print(
        f"""Installed the SGME memory provider in {target}

Enable it (Hermes runs one external memory provider at a time):
  {prefix}hermes config set memory.provider {PLUGIN_NAME}
or in {home / "config.yaml"}:
  memory:
    provider: {PLUGIN_NAME}

Point it at SGME, in the environment or in {home / ".env"} (Hermes loads it at start):
  SGME_URL={url}
  SGME_AGENT_ID=hermes
  SGME_TOKEN=...   # once the server has tokens; make one with only what the provider needs
                   # (append to store the turns, read to recall and search them):
                   #   sgme token create --agent-id hermes --scope append,read --name hermes
(`hermes memory setup` asks for the same. Turns the server cannot take wait in
{home / "sgme" / "spool"} and are sent when it is back.)"""
    )
    return 0


def register(add: Add) -> None:
    """Declare ``sgme hermes install``."""
    # It writes into a Hermes home, not into SGME's data directory or index: --data-dir and
    # --database-url mean nothing here; --config names the server whose URL is suggested.
    p = add("hermes", cmd_install, "the Hermes Agent memory provider: install it", common=False)
    p.add_argument("--config", help="YAML settings file of the server (env SGME_CONFIG)")
    p.add_argument("action", choices=("install",), help="copy it to HERMES_HOME/plugins/sgme/")
    p.add_argument(
        "--hermes-home", metavar="DIR", help="the Hermes home (default: $HERMES_HOME, ~/.hermes)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing plugins/sgme whole, even files the provider did not put there",
    )
