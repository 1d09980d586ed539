"""Build hook (the metadata is in pyproject.toml): ship the Hermes Agent memory provider inside
the ``pipeline`` package, so that ``sgme hermes install`` works from an installed wheel.

The provider's source stays in ``integrations/hermes/sgme/``: it runs in Hermes' environment,
not ours, and is developed and tested there. At build time its files are copied as data to
``pipeline/hermes-provider/`` — a name that cannot be imported, because the provider must
never be imported into this package's environment (it imports Hermes' ``agent`` package).
An editable install or a checkout has no copy; ``pipeline.cli.hermes`` then reads the source
directory itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROVIDER = Path(__file__).resolve().parent / "integrations" / "hermes" / "sgme"
PACKAGED = ("pipeline", "hermes-provider")  #: where the copy goes, under the build directory
SUFFIXES = (".py", ".yaml")  #: the provider's files (not __pycache__ and other leftovers)


class BuildPyWithProvider(build_py):
    """``build_py``, then the provider's files copied into the built ``pipeline`` package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's directory
        files = sorted(p for p in PROVIDER.iterdir() if p.is_file() and p.suffix in SUFFIXES)
        if not any(p.name == "__init__.py" for p in files):
            raise RuntimeError(f"the Hermes provider is missing from {PROVIDER}")
        target = Path(self.build_lib, *PACKAGED)
        target.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copyfile(path, target / path.name)


setup(cmdclass={"build_py": BuildPyWithProvider})
