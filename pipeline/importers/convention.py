"""The tool-call convention's former home: it is :mod:`pipeline.convention` now, beside the
format it extends, so that the core reads messages without importing the importers. This name
stays importable — the same module object, not a copy (``chat.py`` imports its sibling
relatively, as it must inside the Hermes provider, and programs may have used it)."""

from __future__ import annotations

import sys

from pipeline import convention
from pipeline.convention import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = convention
