"""The combined flushes of waiting appends (:mod:`pipeline.waits`), with the flusher's rounds
played by a fake: who shares a round, who waits again, who gets which error; and the
flusher's sync pool (:mod:`pipeline.flusher`)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import helpers
import pytest

from pipeline import errors, flusher, waits
from pipeline.flush import FlushResult, Round


def result(file_id: str, seq: int) -> FlushResult:
    return FlushResult(file_id, 1, 10, seq, "new")


class Fakes(flusher.Flusher):
    """A flusher whose rounds record their calls and answer as planned. A round that waits
    for its lock (a lone file's, or one handed back to run on its own) is recorded in
    :attr:`alone`; the one of the file ``"gate"`` holds until :attr:`release` is set (the
    round everybody else queues behind)."""

    def __init__(self, rounds: list[Callable[[list[str]], Round]]) -> None:
        self.planned = rounds
        self.rounds: list[list[str]] = []
        self.leaders: list[threading.Thread] = []  #: the thread that ran each round
        self.alone: list[str] = []
        self.release = threading.Event()
        self.alone_answers: dict[str, Callable[[], FlushResult]] = {}

    def round(self, file_ids: list[str], *, wait: bool = False) -> Round:
        if wait:
            (file_id,) = file_ids
            self.alone.append(file_id)
            if file_id == "gate":
                assert self.release.wait(10)
            answer = self.alone_answers.get(file_id, lambda: result(file_id, 99))
            try:
                return Round(results={file_id: answer()})
            except errors.SgmeError as exc:
                return Round(errors={file_id: exc})
        self.rounds.append(file_ids)
        self.leaders.append(threading.current_thread())
        return self.planned.pop(0)(file_ids)


def every(seq: int) -> Callable[[list[str]], Round]:
    return lambda file_ids: Round(results={f: result(f, seq) for f in file_ids})


class Caller(threading.Thread):
    """A thread that waits for one file, keeping its answer or its error."""

    def __init__(self, combined: waits.Waits, file_id: str, seq: int) -> None:
        super().__init__(daemon=True)
        self.combined, self.file_id, self.seq = combined, file_id, seq
        self.answer: Any = None
        self.joined: waits.Joined | None = None

    def run(self) -> None:
        try:
            self.joined = self.combined.join(self.file_id, self.seq)
            self.answer = self.joined.result()
        except BaseException as exc:
            self.answer = exc


def behind_a_gate(
    fakes: Fakes, combined: waits.Waits, calls: list[tuple[str, int]]
) -> Iterator[Caller]:
    """Callers for ``calls``, all queued while the flush of ``"gate"`` holds, then released;
    yields each once it answered, in the order of ``calls``."""
    gates = fakes.alone.count("gate") + 1
    gate = Caller(combined, "gate", 1)
    gate.start()
    helpers.wait_for(lambda: fakes.alone.count("gate") == gates, what="the gate's flush")
    callers = [Caller(combined, file_id, seq) for file_id, seq in calls]
    for caller in callers:
        caller.start()
    helpers.wait_for(lambda: combined.queued() == len(calls), what="the waits queued")
    fakes.release.set()
    for caller in [gate, *callers]:
        caller.join(10)
        assert not caller.is_alive()
    yield from callers


def test_a_lone_wait_is_flushed_on_its_own_at_once() -> None:
    fakes = Fakes([])
    combined = waits.Waits(fakes)
    joined = combined.join("a", 3)
    assert joined.result() == result("a", 99)
    assert joined.led == [result("a", 99)]  # its caller runs what follows the round it led
    assert (fakes.rounds, fakes.alone) == ([], ["a"])
    assert (combined.rounds, combined.settled) == (1, 1)


def test_waits_queued_while_a_flush_runs_share_the_next_round() -> None:
    fakes = Fakes([every(5)])
    combined = waits.Waits(fakes)
    calls = [("b", 2), ("c", 5), ("b", 4), ("d", 1)]
    answers = [caller.answer for caller in behind_a_gate(fakes, combined, calls)]
    assert fakes.rounds == [["b", "c", "d"]]  # one round, each file once, in queue order
    assert answers == [result("b", 5), result("c", 5), result("b", 5), result("d", 5)]
    assert (combined.rounds, combined.settled) == (2, 5)


def test_a_file_the_round_did_not_reach_is_waited_for_again_first() -> None:
    # the first round leaves b short of seq 4 with more to write and c past its byte budget;
    # the next round is theirs (two files again), in the order they were queued
    more = FlushResult("b", 1, 10, 2, "new", more=True)  # one chunk written, more left
    short = lambda ids: Round(results={"b": more, "d": result("d", 7)}, later=["c"])  # noqa: E731
    fakes = Fakes([short, every(6)])
    combined = waits.Waits(fakes)
    callers = list(behind_a_gate(fakes, combined, [("b", 4), ("c", 1), ("d", 7)]))
    assert fakes.rounds == [["b", "c", "d"], ["b", "c"]]
    assert [c.answer for c in callers] == [result("b", 6), result("c", 6), result("d", 7)]


def test_a_flush_short_of_the_seq_with_nothing_left_is_the_answer() -> None:
    """A file whose journal holds nothing more (it cannot reach the seq) is not waited for
    again, round after round: its flush's answer is taken as a flush of one file's was."""
    fakes = Fakes([every(1)])
    combined = waits.Waits(fakes)
    callers = list(behind_a_gate(fakes, combined, [("b", 3), ("c", 1)]))
    assert fakes.rounds == [["b", "c"]]
    assert [c.answer for c in callers] == [result("b", 1), result("c", 1)]


def test_a_round_wakes_the_callers_it_settled_and_hands_the_lead_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No caller is woken to find it has nothing to do: each is woken once when its wait
    settles, and once more only when it is to lead. After a round the caller first in the
    queue leads the next: the first of those whose file the round left short, put back at
    the front in their order."""
    woken: dict[str, int] = {}

    class Counted(waits._Wait):
        def __init__(self, file_id: str, seq: int) -> None:
            super().__init__(file_id, seq)
            event = self.woken

            def counted_set() -> None:
                woken[file_id] = woken.get(file_id, 0) + 1
                threading.Event.set(event)

            event.set = counted_set  # type: ignore[method-assign]

    monkeypatch.setattr(waits, "_Wait", Counted)
    short = {"c": FlushResult("c", 1, 10, 1, "new", more=True)}
    short["d"] = dataclasses.replace(short["c"], file_id="d")
    first = lambda ids: Round(results={f: short.get(f) or result(f, 1) for f in ids})  # noqa: E731
    fakes = Fakes([first, every(2)])
    combined = waits.Waits(fakes)
    callers = list(behind_a_gate(fakes, combined, [("b", 1), ("c", 2), ("d", 2)]))
    again = [f for f in fakes.rounds[0] if f in short]
    assert sorted(fakes.rounds[0]) == ["b", "c", "d"] and fakes.rounds[1] == again
    led = [next(c.file_id for c in callers if c is leader) for leader in fakes.leaders]
    assert led == [fakes.rounds[0][0], again[0]]  # the first queued wait's caller, each time
    assert [c.answer for c in callers] == [result("b", 1), result("c", 2), result("d", 2)]
    assert (combined.rounds, combined.settled, combined.leading()) == (3, 4, False)
    # once settled, once more to lead: the first queued after the gate's flush, then the
    # first of the two the first round left short
    expected = {"gate": 1, "b": 1, "c": 1, "d": 1}
    expected[fakes.rounds[0][0]] += 1
    expected[again[0]] += 1
    assert woken == expected


def test_files_handed_back_are_flushed_alone_and_fail_alone() -> None:
    handed = lambda ids: Round(results={"b": result("b", 1)}, again=["c", "d"])  # noqa: E731
    fakes = Fakes([handed])
    combined = waits.Waits(fakes)

    def damaged() -> FlushResult:
        raise errors.FileDamaged("d is damaged")

    fakes.alone_answers["d"] = damaged
    callers = list(behind_a_gate(fakes, combined, [("b", 1), ("c", 1), ("d", 1)]))
    assert fakes.alone == ["gate", "c", "d"]
    assert [c.answer for c in callers[:2]] == [result("b", 1), result("c", 99)]
    assert isinstance(callers[2].answer, errors.FileDamaged)
    # the round's leader got every result of it, the ones flushed alone too (not the error)
    led = [c.joined.led for c in callers if c.joined and c.joined.led]
    assert sorted(r.file_id for r in led[0]) == ["b", "c"] and len(led) == 1


def test_a_failed_round_fails_every_wait_in_it_and_the_next_one_runs() -> None:
    def broken(ids: list[str]) -> Round:
        raise errors.IndexUnavailable("index unreachable")

    fakes = Fakes([broken, every(3)])
    combined = waits.Waits(fakes)
    callers = list(behind_a_gate(fakes, combined, [("b", 1), ("c", 1)]))
    assert all(isinstance(c.answer, errors.IndexUnavailable) for c in callers)
    assert callers[0].answer is callers[1].answer
    assert combined.queued() == 0
    # nobody is left leading: the next waits are flushed
    fakes.release.clear()
    again = list(behind_a_gate(fakes, combined, [("b", 2), ("c", 2)]))
    assert [c.answer for c in again] == [result("b", 3), result("c", 3)]


def test_the_syncs_of_a_round_run_side_by_side_and_report_each_error() -> None:
    started = threading.Barrier(3, timeout=10)
    ran: list[int] = []

    def sync(i: int) -> None:
        started.wait()  # all three at once, or the barrier breaks
        ran.append(i)
        if i == 1:
            raise OSError("disk on fire")

    outcomes = flusher._SyncPool().run([lambda i=i: sync(i) for i in range(3)])  # type: ignore[misc]
    assert sorted(ran) == [0, 1, 2]
    assert [type(o) for o in outcomes] == [type(None), OSError, type(None)]


@pytest.mark.parametrize("count", [0, 1])
def test_one_sync_or_none_runs_on_the_calling_thread(count: int) -> None:
    threads: list[threading.Thread] = []
    pool = flusher._SyncPool()
    outcomes = pool.run([lambda: threads.append(threading.current_thread())] * count)
    assert outcomes == [None] * count
    assert threads == [threading.current_thread()] * count


def test_a_forked_child_runs_its_own_syncs_and_leads_its_own_rounds() -> None:
    """A child forked while the parent's pool exists and a round runs gets neither: its
    syncs run on threads of its own and its first wait leads."""
    syncs = flusher._SyncPool()
    syncs.run([lambda: None, lambda: None])  # the parent's pool, made
    fakes = Fakes([])
    combined = waits.Waits(fakes)
    leading = Caller(combined, "gate", 1)
    leading.start()
    helpers.wait_for(combined.leading, what="the round in progress")
    pid = os.fork()
    if pid == 0:  # the child: neither the pool's threads nor the leading thread are here
        signal.alarm(10)  # a child that waits for them is killed, and the test fails
        ran: list[int] = []
        try:
            outcomes = syncs.run([lambda: ran.append(1), lambda: ran.append(2)])
            answer = combined.join("a", 1).result()
            ok = outcomes == [None, None] and sorted(ran) == [1, 2] and answer == result("a", 99)
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    fakes.release.set()
    leading.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
