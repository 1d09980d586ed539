"""Driver for test_redaction_crash.py: redact one message and SIGKILL this process at a step of
the redaction (one of ``rewrite.REDACT_STEPS``), or at a step of an erasure
(``erasure.ERASE_STEPS``, with ``erase:FILE_ID`` as the ref).

    python redact_child.py DATABASE_URL DATA_DIR REF STEP
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from pipeline import database, erasure, locks, redaction, rewrite


def main() -> None:
    url, data_dir, ref, step = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    db = database.Database.from_url(url)
    file_locks = locks.FileLocks(db, data_dir, timeout=10)

    def fault(at: str) -> None:
        if at == step:
            os.kill(os.getpid(), signal.SIGKILL)

    who = rewrite.Who("crash test", "leaked in a test")
    if ref.startswith("erase:"):
        erasure.erase_file(db, file_locks, data_dir, ref.removeprefix("erase:"), who, fault=fault)
    else:
        redaction.redact(db, file_locks, data_dir, ref, who, fault=fault)
    sys.exit("the fault step was never reached")


if __name__ == "__main__":
    main()
