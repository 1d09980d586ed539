"""Driver for test_ack_sync.py, run under ``strace``: appends from THREADS threads, each
writing ``ACK <thread> <n>`` to /dev/null as soon as its append was acknowledged.

    python ack_child.py DATA_DIR ingest|service THREADS

``ingest``: ``journal.ingest`` alone (every commit durable).
``service``: ``Service.append`` with the embedded service's batched flusher writing the files
meanwhile (lazy commits of its own, in the same WAL).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import helpers

from pipeline import database, journal, local_queue, validation
from pipeline.settings import Settings

APPENDS = 15


def main() -> None:
    data_dir, mode, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    url = f"sqlite:///{data_dir / 'index.sqlite3'}"
    db = database.Database.from_url(url)
    database.migrate(db.engine)
    marker = os.open("/dev/null", os.O_WRONLY)
    queue = local_queue.LocalQueue(helpers.RecordingQueue(), threads=2)
    service = helpers.service(db, Settings(data_dir=data_dir, database_url=url), queue)
    if mode == "service":
        queue.start(service.flusher, service.follow_up)

    def stream(t: int) -> None:
        for n in range(APPENDS):
            body = {
                "agent_id": "a",
                "session_key": f"s{t}",
                "messages": [{"role": "user", "content": f"{n}"}],
            }
            if mode == "service":
                service.append(validation.parse_append(body, service.settings.limits))
            else:
                journal.ingest(db, body)
            os.write(marker, f"ACK {t} {n}".encode())

    threads = [threading.Thread(target=stream, args=(t,)) for t in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    helpers.wait_for(queue.idle, what="the flushes", timeout=30)
    queue.close()
    db.dispose()


if __name__ == "__main__":
    main()
