"""``python -m pipeline.cli``: the ``sgme`` command."""

import sys

from pipeline.cli import main

sys.exit(main())
