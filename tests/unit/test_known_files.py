"""The files of sessions an API process remembers (:class:`pipeline.ingest.KnownFiles`): the
key of an append's piece of a group, bounded."""

from __future__ import annotations

from pipeline import ingest, validation


def _append(session_key: str, agent_id: str = "hermes") -> validation.Append:
    messages = [{"role": "user", "content": "hello"}]
    return validation.parse_append(
        {"agent_id": agent_id, "session_key": session_key, "messages": messages}
    )


def test_a_session_is_known_by_its_agent_type_and_key() -> None:
    known = ingest.KnownFiles()
    assert known.key(_append("s")) is None
    known.learn(_append("s"), "file-1")
    assert known.key(_append("s")) == "file-1"
    assert known.key(_append("s", agent_id="other")) is None
    assert known.key(_append("t")) is None
    known.learn(_append("s"), "file-2")  # erased and made again
    assert known.key(_append("s")) == "file-2"


def test_past_its_size_it_starts_over() -> None:
    known = ingest.KnownFiles(size=2)
    known.learn(_append("a"), "file-a")
    known.learn(_append("b"), "file-b")
    known.learn(_append("c"), "file-c")
    assert [known.key(_append(k)) for k in "abc"] == [None, None, "file-c"]


def test_with_no_size_it_remembers_nothing() -> None:
    known = ingest.KnownFiles(size=0)
    known.learn(_append("s"), "file-1")
    assert known.key(_append("s")) is None
