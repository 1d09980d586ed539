"""One broker database per store (docs/design.md §8, docs/operations.md "One broker database per
store"): the store's name on its Redis database, and where a task of another store goes.

* **The claim.** The first process of a store (``sgme worker``, ``beat``, ``api``, ``serve``)
  writes its deployment id under :data:`OWNER_KEY`; a process of another store refuses to start
  there (:func:`claim`). A wipe of the database (``FLUSHDB``, a Redis that came back empty)
  takes the key with it, so every running process asserts it again every
  ``broker_claim_interval`` seconds (:class:`Keeper`): another store cannot claim a database
  one is using for longer than that.
* **Tasks of another store.** Every task a store sends carries its id in the header
  :data:`HEADER`. A worker that takes a task carrying another id (the two stores met within
  that window, or an ingestion service stamped its tasks for another store) does not run it
  and does not drop it: it passes it on to that store's own queue, :func:`queue` — which every
  worker of that store consumes besides the queues it was given.
"""

from __future__ import annotations

import logging
import re
import threading

from pipeline import errors

log = logging.getLogger(__name__)

#: the message header a task carries its deployment in
HEADER = "sgme_deployment"
#: the key in the broker's Redis database that names the deployment using it
OWNER_KEY = "sgme:deployment"
#: a deployment id (its migration makes a UUID4); a header of any other form names no store
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
QUEUE_PREFIX = "sgme.deployment."
#: where a task whose header names no possible deployment is kept (never run, never dropped)
UNKNOWN = "unknown"


def shared(broker_url: str) -> bool:
    """Whether the broker can be shared with another store (Redis; not the in-memory one)."""
    return broker_url.startswith(("redis://", "rediss://", "unix://"))


def queue(deployment: str) -> str:
    """The queue of the deployment's own: its workers consume it, other stores' workers pass
    its tasks on to it."""
    name = deployment if _ID.fullmatch(deployment) else UNKNOWN
    return f"{QUEUE_PREFIX}{name}"


def claim(broker_url: str, deployment: str) -> None:
    """Make sure no other deployment uses this broker database: name this one there unless a
    deployment is named already; :class:`errors.Misconfigured` when it is another. Nothing for
    the in-memory broker; a broker that cannot be reached is left to Celery's own retries."""
    owner = _assert(broker_url, deployment)
    if owner is not None and owner != deployment:
        raise errors.Misconfigured(
            f"the broker database {_redacted(broker_url)} belongs to deployment "
            f"{owner}; this store is deployment {deployment}. Two stores sharing one "
            "broker database would take each other's tasks: give this one its own "
            f"(broker_url), or, if the other store is gone for good, delete the key "
            f"{OWNER_KEY!r} there"
        )


def _assert(broker_url: str, deployment: str, *, outage: int = logging.WARNING) -> str | None:
    """Name ``deployment`` on the broker unless a deployment is named there; the one named
    afterwards (None: not a shared broker, or it could not be asked: logged at ``outage``)."""
    if not shared(broker_url):
        return None
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.set(OWNER_KEY, deployment, nx=True)
        found = client.get(OWNER_KEY)
    except redis.RedisError as exc:
        log.log(outage, "could not check who else uses the broker: %s", exc)
        return None
    finally:
        client.close()
    return found.decode() if isinstance(found, bytes) else found


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


class Keeper:
    """A thread that asserts the claim every ``interval`` seconds while the process runs, so a
    wiped broker database names this store again before another can take it. Finding another
    store named there (it claimed the database in the meantime) is logged as an error, once
    each time it changes: both stores now use the database, and their tasks are passed on to
    each other's queues (the module docstring)."""

    def __init__(self, broker_url: str, deployment: str, *, interval: float) -> None:
        self.broker_url = broker_url
        self.deployment = deployment
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported: str | None = None

    def start(self) -> None:
        """Start asserting (nothing for a broker that cannot be shared)."""
        if not shared(self.broker_url) or self._thread is not None or self.interval <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="sgme-broker-claim", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop asserting (waits for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def assert_once(self) -> None:
        """Assert the claim now: what the thread does every ``interval``."""
        # a broker that is down is Celery's to report (and the next round asks again)
        owner = _assert(self.broker_url, self.deployment, outage=logging.DEBUG)
        if owner is None or owner == self.deployment:
            self._reported = None
            return
        if owner != self._reported:
            self._reported = owner
            log.error(
                "the broker database %s now belongs to deployment %s (it was wiped and "
                "another store claimed it); this store is deployment %s. Their tasks that "
                "reach this store's workers are passed on to them, and ours to us, but the "
                "two should not share it: give each store its own (broker_url)",
                _redacted(self.broker_url),
                owner,
                self.deployment,
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.assert_once()
            except Exception:  # a bug: logged, and the next round tries again
                log.exception("asserting the broker claim failed")
