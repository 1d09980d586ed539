"""``sgme hermes install``: put the Hermes Agent memory provider where Hermes finds user
plugins, ``$HERMES_HOME/plugins/sgme/``, and say how to turn it on.

The provider's files come with this package: an installed wheel carries a copy in
``pipeline/hermes-provider/`` (made by ``setup.py`` at build time); a checkout or an editable
install reads ``integrations/hermes/sgme/`` itself.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import shutil
import uuid
from importlib.resources.abc import Traversable
from pathlib import Path

import pipeline
from pipeline import errors, settings
from pipeline.cli.context import Add, Context

PLUGIN_NAME = "sgme"  #: the directory under plugins/, and ``memory.provider``'s value
PACKAGED = "hermes-provider"  #: the copy inside an installed ``pipeline`` package
CHECKOUT = Path(pipeline.__file__).resolve().parent.parent / "integrations" / "hermes" / "sgme"
SUFFIXES = (".py", ".yaml")  #: the provider's files (setup.py copies the same)


def provider_files() -> list[Traversable]:
    """The provider's files: the installed copy, else the checkout's source."""
    for where in (importlib.resources.files(pipeline) / PACKAGED, CHECKOUT):
        if where.is_dir():
            found = sorted(
                (f for f in where.iterdir() if f.is_file() and f.name.endswith(SUFFIXES)),
                key=lambda f: f.name,
            )
            if any(f.name == "__init__.py" for f in found):
                return found
    raise errors.Misconfigured(
        "the Hermes provider's files are not part of this installation (looked in the "
        f"package's {PACKAGED}/ and in {CHECKOUT}): reinstall sgme-l0 from a wheel or a "
        "checkout"
    )


def install(home: Path) -> Path:
    """Copy the provider to ``home/plugins/sgme/``, replacing an earlier install whole; the
    directory it made. The files are written to a hidden directory beside it first (Hermes
    skips names starting with a dot), then renamed into place, so Hermes never loads half."""
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


def cmd_install(ctx: Context) -> int:
    """Install the provider into a Hermes home and print how to enable and configure it."""
    home = Path(ctx.args.hermes_home) if ctx.args.hermes_home else settings.hermes_home()
    s = ctx.settings()  # for the URL to suggest; a bad config stops before anything is copied
    target = install(home)
    host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host
    url = f"http://{f'[{host}]' if ':' in host else host}:{s.port}"
    print(
        f"""Installed the SGME memory provider in {target}

Enable it (Hermes runs one external memory provider at a time):
  hermes config set memory.provider {PLUGIN_NAME}
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
    p = add("hermes", cmd_install, "the Hermes Agent memory provider: install it")
    p.add_argument("action", choices=("install",), help="copy it to HERMES_HOME/plugins/sgme/")
    p.add_argument(
        "--hermes-home", metavar="DIR", help="the Hermes home (default: $HERMES_HOME, ~/.hermes)"
    )
