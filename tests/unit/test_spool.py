"""The spool live capture and the Hermes provider share: private, in order, one file (one
fsync) for what one run puts, redacted before it is written, bad lines and refused bodies set
aside without blocking the rest (``rejected/`` bounded), a bound that refuses new bodies and
never drops spooled ones, one deliverer at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.capture import spool
from pipeline.capture.spool import Outcome


def body(n: int, agent: str = "a") -> dict[str, Any]:
    return {"agent_id": agent, "session_key": "s", "idempotency_key": f"k{n}", "messages": []}


class Server:
    """Answers each body by its agent: ``refused`` ones for good, all of them ``later`` while
    ``down``; records what it stored."""

    def __init__(self, *, refused: tuple[str, ...] = (), down: bool = False) -> None:
        self.refused = refused
        self.down = down
        self.stored: list[str] = []

    def __call__(self, sent: dict[str, Any]) -> tuple[Outcome, str]:
        if self.down:
            return Outcome.LATER, "connection refused"
        if sent["agent_id"] in self.refused:
            return Outcome.REFUSED, "403 not this token's agent"
        self.stored.append(sent["idempotency_key"])
        return Outcome.SENT, ""


def test_bodies_are_private_and_delivered_in_order(tmp_path: Path) -> None:
    box = spool.Spool(tmp_path / "spool")
    for n in range(5):
        box.put([body(n)])
    assert (tmp_path / "spool").stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in box.pending()} == {0o600}
    assert not [p for p in (tmp_path / "spool").iterdir() if p.name.endswith(".tmp")]
    server = Server(down=True)
    assert box.deliver(server) is False and len(box.pending()) == 5  # kept while down
    server.down = False
    assert box.deliver(server) is True
    assert server.stored == ["k0", "k1", "k2", "k3", "k4"] and box.pending() == []


def test_an_older_spool_directory_is_made_private(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir(mode=0o755)
    os.chmod(tmp_path / "spool", 0o755)
    spool.Spool(tmp_path / "spool").put([body(0)])
    assert (tmp_path / "spool").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("content", [b"[1, 2]", b"{broken", b"\xff\xfe", b"[" * 100_000])
def test_a_bad_line_is_set_aside_and_the_rest_goes_on(tmp_path: Path, content: bytes) -> None:
    box = spool.Spool(tmp_path)
    box.put([body(0)])
    bad = tmp_path / "00000000000000000001-1-000001.jsonl"  # sorts first
    bad.write_bytes(json.dumps(body(9)).encode() + b"\n" + content + b"\n")
    box.put([body(1)])
    server = Server()
    assert box.deliver(server) is True
    assert server.stored == ["k9", "k0", "k1"]
    (aside,) = (tmp_path / "rejected").glob("*.json")
    assert aside.read_bytes() == content + b"\n"
    assert aside.with_suffix(".reason").read_text().startswith(("unreadable", "not an append"))
    assert box.pending() == []


def test_a_file_of_an_earlier_version_is_delivered(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000001-1-000001.json").write_text(json.dumps(body(0)))
    box = spool.Spool(tmp_path)
    box.put([body(1)])
    server = Server()
    assert box.deliver(server) is True and server.stored == ["k0", "k1"]


def test_what_one_run_puts_is_one_file_and_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    box = spool.Spool(tmp_path / "spool")
    box.put([body(n) for n in range(1000)])
    assert len(box.pending()) == 1
    assert len(synced) == 2  # the file, then its directory
    lines = box.pending()[0].read_bytes().splitlines()
    assert [json.loads(line)["idempotency_key"] for line in lines] == [f"k{n}" for n in range(1000)]


def test_what_is_left_of_a_file_keeps_its_place(tmp_path: Path) -> None:
    box = spool.Spool(tmp_path)
    first = box.put([body(n) for n in range(4)])
    box.put([body(4)])
    taken: list[str] = []

    def send(sent: dict[str, Any]) -> tuple[Outcome, str]:
        if len(taken) == 2:
            return Outcome.LATER, "the server went away"
        taken.append(sent["idempotency_key"])
        return Outcome.SENT, ""

    before = first.read_bytes()
    assert box.deliver(send) is False
    # first in line still, its bytes not written again: how far it went is noted beside it
    assert box.pending()[0] == first and first.read_bytes() == before
    assert (tmp_path / f".{first.name}.done").read_text() == "2"
    assert box.waiting().bodies == 3
    server = Server()
    assert box.deliver(server) is True
    assert taken + server.stored == ["k0", "k1", "k2", "k3", "k4"]
    assert not list(tmp_path.glob(".*.done"))


def test_bodies_are_redacted_before_they_are_written(tmp_path: Path) -> None:
    from pipeline import redactor

    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    box = spool.Spool(tmp_path, scrub=spool.scrubber(redactor.redact))
    sent = {
        **body(0),
        "messages": [{"role": "user", "content": f"my token is {secret}"}],
        "metadata": {"title": f"about {secret}", "n": 1},
    }
    box.put([sent])
    data = box.pending()[0].read_text()
    assert secret not in data and "[REDACTED:github-token]" in data
    assert json.loads(data)["metadata"]["n"] == 1
    assert sent["messages"][0]["content"].endswith(secret)  # the caller's body is not changed


def test_rejected_keeps_at_most_its_bound_newest_first(tmp_path: Path) -> None:
    box = spool.Spool(tmp_path, max_rejected_bytes=3 * (len(json.dumps(body(0))) + 1))
    for n in range(5):
        box.set_aside(body(n), "422 invalid")
    kept = sorted((tmp_path / "rejected").glob("*.json"))
    assert [json.loads(p.read_text())["idempotency_key"] for p in kept] == ["k2", "k3", "k4"]
    assert len(list((tmp_path / "rejected").glob("*.reason"))) == 3
    assert len(box.dropped) == 2
    assert box.waiting().rejected == 3


def test_a_refused_body_is_set_aside_with_its_reason_and_later_ones_go(tmp_path: Path) -> None:
    box = spool.Spool(tmp_path)
    box.put([body(0, agent="old-agent")])  # spooled before SGME_AGENT_ID changed
    box.put([body(1)])
    server = Server(refused=("old-agent",))
    assert box.deliver(server) is True
    assert server.stored == ["k1"]
    (aside,) = (tmp_path / "rejected").glob("*.json")
    assert json.loads(aside.read_text())["idempotency_key"] == "k0"
    assert "403" in aside.with_suffix(".reason").read_text()


def test_the_bound_refuses_new_bodies_and_keeps_the_spooled_ones(tmp_path: Path) -> None:
    size = len(json.dumps(body(0)).encode()) + 1
    box = spool.Spool(tmp_path, max_bytes=2 * size)
    box.put([body(0)])
    box.put([body(1)])
    with pytest.raises(spool.Full, match="bound"):
        box.put([body(2)])
    assert len(box.pending()) == 2
    box.deliver(Server())
    box.put([body(2)])  # room again once delivered
    assert len(box.pending()) == 1


def test_a_spool_that_cannot_be_written_says_so(tmp_path: Path) -> None:
    (tmp_path / "spool").write_text("a file where the directory should be")
    with pytest.raises(OSError):
        spool.Spool(tmp_path / "spool").put([body(0)])


def test_one_deliverer_at_a_time(tmp_path: Path) -> None:
    box = spool.Spool(tmp_path)
    box.put([body(0)])
    other = spool.Spool(tmp_path)
    seen: list[bool] = []

    def send(sent: dict[str, Any]) -> tuple[Outcome, str]:
        seen.append(other.deliver(Server()))  # a second deliverer meanwhile: it leaves it
        return Outcome.SENT, ""

    assert box.deliver(send) is True
    assert seen == [False]
