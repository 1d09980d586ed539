"""The spool live capture and the Hermes provider share: private, in order, bad files and
refused bodies set aside without blocking the rest, a bound that refuses new bodies and never
drops spooled ones, one deliverer at a time."""

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
        box.put(body(n))
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
    spool.Spool(tmp_path / "spool").put(body(0))
    assert (tmp_path / "spool").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("content", [b"[1, 2]", b"{broken", b"\xff\xfe", b"[" * 100_000])
def test_a_bad_file_is_set_aside_and_the_rest_goes_on(tmp_path: Path, content: bytes) -> None:
    box = spool.Spool(tmp_path)
    box.put(body(0))
    bad = tmp_path / "00000000000000000001-1-000001.json"  # sorts first
    bad.write_bytes(content)
    box.put(body(1))
    server = Server()
    assert box.deliver(server) is True
    assert server.stored == ["k0", "k1"]
    assert (tmp_path / "rejected" / bad.name).read_bytes() == content
    assert (tmp_path / "rejected" / f"{bad.stem}.reason").read_text().strip()


def test_a_refused_body_is_set_aside_with_its_reason_and_later_ones_go(tmp_path: Path) -> None:
    box = spool.Spool(tmp_path)
    box.put(body(0, agent="old-agent"))  # spooled before SGME_AGENT_ID changed
    box.put(body(1))
    server = Server(refused=("old-agent",))
    assert box.deliver(server) is True
    assert server.stored == ["k1"]
    (aside,) = (tmp_path / "rejected").glob("*.json")
    assert json.loads(aside.read_text())["idempotency_key"] == "k0"
    assert "403" in aside.with_suffix(".reason").read_text()


def test_the_bound_refuses_new_bodies_and_keeps_the_spooled_ones(tmp_path: Path) -> None:
    size = len(json.dumps(body(0)).encode())
    box = spool.Spool(tmp_path, max_bytes=2 * size)
    box.put(body(0))
    box.put(body(1))
    with pytest.raises(spool.Full, match="bound"):
        box.put(body(2))
    assert len(box.pending()) == 2
    box.deliver(Server())
    box.put(body(2))  # room again once delivered
    assert len(box.pending()) == 1


def test_a_spool_that_cannot_be_written_says_so(tmp_path: Path) -> None:
    (tmp_path / "spool").write_text("a file where the directory should be")
    with pytest.raises(OSError):
        spool.Spool(tmp_path / "spool").put(body(0))


def test_one_deliverer_at_a_time(tmp_path: Path) -> None:
    box = spool.Spool(tmp_path)
    box.put(body(0))
    other = spool.Spool(tmp_path)
    seen: list[bool] = []

    def send(sent: dict[str, Any]) -> tuple[Outcome, str]:
        seen.append(other.deliver(Server()))  # a second deliverer meanwhile: it leaves it
        return Outcome.SENT, ""

    assert box.deliver(send) is True
    assert seen == [False]
