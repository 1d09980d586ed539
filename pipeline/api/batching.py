"""The HTTP append path's committer (docs/design.md §3): ``POST /v1/append`` requests handed
to one thread in batches.

A request that ran its append on a thread of its own (``run_in_threadpool``) paid for the
hand-off to that thread and back, and for the group committer's hand-offs between the
threads whose appends shared a commit — more than the append's own work. Here the event loop
validates the request and queues it; one thread takes everything queued (at most
``max_batch``), commits it as one group (:meth:`pipeline.service.Service.append_many`: a
savepoint per append, one durable commit) and answers the whole batch with one call into the
event loop. Nothing is answered before the commit returned: an acknowledgement still means
the append is on stable storage. An append whose client went away meanwhile is still
committed, as it would have been on a thread of its own.

The thread is started by the first append and ends after :data:`IDLE_SECONDS` without one, so
an app that stops receiving appends (a test's, a reloaded one) leaves no thread behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence

from pipeline import errors, validation
from pipeline.service import Appended, Service

log = logging.getLogger(__name__)

MAX_BATCH = 256  #: appends committed together at most (the group committer's own bound)
IDLE_SECONDS = 5.0  #: the thread ends after this long without an append

#: what makes the append from the request (validates it, checks the caller may): run on the
#: committer thread, so the event loop only reads and answers requests
Prepare = Callable[[], validation.Append]
_Item = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Appended]", Prepare]
_Answer = Appended | BaseException


class AppendBatcher:
    """Appends of one service, committed in batches on one thread."""

    def __init__(self, service: Service, *, max_batch: int = MAX_BATCH) -> None:
        self.service = service
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: batches committed and appends in them (tests and benchmarks read these)
        self.batches = 0
        self.appends = 0

    async def append(self, prepare: Prepare) -> Appended:
        """Commit the append ``prepare`` makes with whatever else is queued; its answer once
        that commit returned, or its refusal (:class:`errors.SgmeError`, from ``prepare`` or
        the commit)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Appended] = loop.create_future()
        with self._lock:
            self._queue.put((loop, answer, prepare))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sgme-append-batches", daemon=True
                )
                self._thread.start()
        return await answer

    def _take(self) -> list[_Item] | None:
        """The next batch; None when nothing came for :data:`IDLE_SECONDS` (the thread ends)."""
        try:
            first = self._queue.get(timeout=IDLE_SECONDS)
        except queue.Empty:
            with self._lock:
                if self._queue.empty():
                    self._thread = None
                    return None
            first = self._queue.get()
        batch = [first]
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            answers: list[_Answer | None] = [None] * len(batch)
            ready: list[tuple[int, validation.Append]] = []
            for i, (_, _, prepare) in enumerate(batch):
                try:
                    ready.append((i, prepare()))
                except errors.SgmeError as exc:
                    answers[i] = exc
                except Exception as exc:  # a bug: this request answers it as one
                    log.exception("an append could not be prepared")
                    answers[i] = _bug(exc)
            try:
                done: Sequence[_Answer] = self.service.append_many([b for _, b in ready])
            except Exception as exc:  # a bug: every request of the batch answers it as one
                log.exception("a batch of %d appends failed", len(ready))
                done = [_bug(exc)] * len(ready)
            for (i, _), answer in zip(ready, done, strict=True):
                answers[i] = answer
            self.batches += 1
            self.appends += len(ready)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Appended], _Answer]]]
            by_loop = {}
            for (loop, future, _), found in zip(batch, answers, strict=True):
                assert found is not None
                by_loop.setdefault(loop, []).append((future, found))
            for loop, settled in by_loop.items():
                # a closed loop raises RuntimeError: nobody is waiting any more
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, settled)


def _bug(exc: Exception) -> errors.InternalError:
    bug = errors.InternalError("internal error")
    bug.__cause__ = exc
    return bug


def _settle(settled: list[tuple[asyncio.Future[Appended], _Answer]]) -> None:
    """Answer each waiting request (on its event loop)."""
    for future, answer in settled:
        if future.done():  # cancelled: the client went away; the append stands
            continue
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
