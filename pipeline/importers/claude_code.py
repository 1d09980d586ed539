"""Claude Code transcripts: ``~/.claude/projects/<encoded cwd>/<sessionId>.jsonl``, and its
subagents' ``<sessionId>/subagents/agent-<id>.jsonl`` (older versions: ``agent-<id>.jsonl``
beside it).

Each line is a record with ``type``, ``uuid``, ``parentUuid``, ``sessionId``, ``timestamp``,
``cwd``, ``gitBranch``, ``version``, ``isSidechain``, ``isMeta`` and a ``message``:

- the records form a tree through ``parentUuid``: a rewind ("fork from here") starts a new
  branch beside the old one. The transcript is the branch that leads to the latest message,
  followed back to its root. A compaction starts a new root — a ``system`` record with
  ``subtype: "compact_boundary"`` and no parent — whose ``logicalParentUuid`` names the last
  message before it; the walk continues there, so the whole conversation is one session;
- user content is a string or blocks: ``text``, ``image`` (written ``[image]``) and
  ``tool_result`` (``tool_use_id``, ``content``) — a tool result in the convention, named after
  the ``tool_use`` it answers;
- assistant records hold one content block each (``text``, ``tool_use`` {id, name, input},
  ``thinking``, ``redacted_thinking``); consecutive records of one ``message.id`` are one
  message: its thinking (marked as thinking: it is the model's reasoning, not its answer), its
  text, then its calls with ``input`` as JSON and their ids (a result names the id it answers);
- the compaction's own summary (``isCompactSummary``: what the model wrote to continue the
  compacted conversation) is kept, marked as a compaction summary, as a turn of its own;
- ``isMeta`` records (injected context, command caveats) and records that are not messages
  (``summary``, ``file-history-snapshot``, other ``system`` records) are left out.

A transcript's last turn is imported once it is finished: by default when it ends with
assistant text (not a call awaiting its result, nor a result the answer has not followed
yet) or the file has not changed for :data:`SETTLED_SECONDS`; live capture says which
(:class:`Tail`). Session key: the sessionId of the conversation's first record, so a resumed
session (a new file that copies the history, whose records keep their sessionId and uuid)
continues the same L0 file and its copied turns replay; a subagent's is
``{sessionId}/agent-{agentId}`` with the parent in its metadata. Keys: ``claude-code:
{session}:{uuid of the turn's first record}:{hash}``.
"""

from __future__ import annotations

import datetime as dt
import enum
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.importers import convention, source

SOURCE = "claude-code"
MESSAGE_TYPES = ("user", "assistant")
_NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)
#: seconds after which a transcript nobody writes to any more counts as finished
SETTLED_SECONDS = 3600.0


class Tail(enum.Enum):
    """What to do with a transcript's last turn."""

    OPEN = "open"  #: the agent is in the middle of it (a subagent or a compaction runs): wait
    SETTLED = "settled"  #: take it when it ends with assistant text (the agent stopped)
    FINISHED = "finished"  #: the session is over: take it whatever it ends with


def files(path: Path) -> list[Path]:
    """``path``, or every transcript (``.jsonl``) under a projects directory."""
    return source.walk(path, (".jsonl",))


def _latest(entries: list[tuple[int, Mapping[str, Any]]]) -> Mapping[str, Any] | None:
    """The latest message record: by timestamp (as a time: ``…06.5Z`` is before ``…06.51Z``,
    though it sorts after it as text), then by position in the file."""
    best: tuple[dt.datetime, int] | None = None
    found: Mapping[str, Any] | None = None
    for line, entry in entries:
        stamp = convention.ts(entry.get("timestamp"))
        rank = (dt.datetime.fromisoformat(stamp) if stamp else _NEVER, line)
        if best is None or rank > best:
            best, found = rank, entry
    return found


def _chain(
    by_uuid: Mapping[str, Mapping[str, Any]], leaf: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The records from the root to ``leaf``, across compaction boundaries."""
    chain: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    current: Mapping[str, Any] | None = leaf
    while current is not None:
        uuid = str(current.get("uuid"))
        if uuid in seen:
            break  # a cycle in a damaged file: stop rather than loop
        seen.add(uuid)
        chain.append(current)
        parent = current.get("parentUuid")
        if not parent and current.get("subtype") == "compact_boundary":
            parent = current.get("logicalParentUuid")
        current = by_uuid.get(parent) if isinstance(parent, str) else None
    chain.reverse()
    return chain


class _Converter:
    """Records of one chain into convention messages, cut into turns."""

    def __init__(self) -> None:
        self.turns: list[tuple[str, int | None, list[convention.Message]]] = []
        self.names: dict[str, str] = {}  # tool_use id -> tool name
        self.skipped = 0
        self._open_id: object = None  # message.id of the assistant message being merged
        self._thinking: list[convention.Message] = []
        self._text: list[str] = []
        self._calls: list[tuple[Any, Any, Any]] = []
        self._when: str | None = None

    def _add(self, message: convention.Message, uuid: str, line: int | None) -> None:
        if message["role"] == "user" or not self.turns:
            self.turns.append((uuid, line, []))
        self.turns[-1][2].append(message)

    def _flush_assistant(self, uuid: str, line: int | None) -> None:
        if self._open_id is None:
            return
        for message in self._thinking:
            self._add(message, uuid, line)
        for message in convention.assistant_turn("\n\n".join(self._text), self._calls, self._when):
            self._add(message, uuid, line)
        self._open_id, self._thinking, self._text, self._calls = None, [], [], []

    def user(self, entry: Mapping[str, Any], content: Any, uuid: str, line: int | None) -> None:
        when = convention.ts(entry.get("timestamp"))
        blocks = content if isinstance(content, list) else [content]
        texts: list[str] = []

        def flush_text() -> None:
            text = "\n".join(texts)
            if text.strip():
                self._add(convention.text_message("user", text, when), uuid, line)
            texts.clear()

        for block in blocks:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                flush_text()
                answered = block.get("tool_use_id")
                name = self.names.get(str(answered), "tool")
                result = convention.tool_result(name, block.get("content"), when, answered)
                self._add(result, uuid, line)
            elif isinstance(block, Mapping) and block.get("type") == "image":
                texts.append("[image]")
            else:
                texts.append(convention.content_text(block))
        flush_text()

    def assistant(
        self, entry: Mapping[str, Any], message: Mapping[str, Any], uuid: str, line: int | None
    ) -> None:
        message_id = message.get("id") or uuid
        if message_id != self._open_id:
            self._flush_assistant(uuid, line)
            self._open_id = message_id
            self._when = convention.ts(entry.get("timestamp"))
        content = message.get("content")
        for block in content if isinstance(content, list) else [content]:
            if isinstance(block, str):
                self._text.append(block)
            elif isinstance(block, Mapping):
                kind = block.get("type")
                if kind == "text" and isinstance(block.get("text"), str):
                    self._text.append(block["text"])
                elif kind == "tool_use":
                    name = convention.tool_name(block.get("name"))
                    if isinstance(block.get("id"), str):
                        self.names[block["id"]] = name
                    self._calls.append((name, block.get("input"), block.get("id")))
                elif kind in ("thinking", "redacted_thinking"):
                    text = block.get("thinking") if kind == "thinking" else "[redacted]"
                    found = convention.thinking(text, self._when)
                    if found is not None:
                        self._thinking.append(found)

    def summary(
        self, entry: Mapping[str, Any], message: Mapping[str, Any], uuid: str, line: int | None
    ) -> None:
        self._flush_assistant(uuid, line)
        found = convention.summary(message.get("content"), convention.ts(entry.get("timestamp")))
        if found is not None:
            self.turns.append((uuid, line, [found]))

    def take(self, entry: Mapping[str, Any], line: int | None) -> None:
        uuid = str(entry.get("uuid"))
        message = entry.get("message")
        if entry.get("type") not in MESSAGE_TYPES or not isinstance(message, Mapping):
            return
        if entry.get("isCompactSummary"):
            self.summary(entry, message, uuid, line)
        elif entry.get("isMeta"):
            self.skipped += 1
        elif entry.get("type") == "assistant":
            self.assistant(entry, message, uuid, line)
        else:
            self._flush_assistant(uuid, line)
            self.user(entry, message.get("content"), uuid, line)

    def finish(self, tail: Tail) -> list[tuple[str, int | None, list[convention.Message]]]:
        self._flush_assistant("", None)
        turns = [turn for turn in self.turns if turn[2]]
        if turns and tail is not Tail.FINISHED:
            last = turns[-1][2][-1]
            answered = (
                last["role"] == "assistant"
                and convention.kind("assistant", last["content"]) == "text"
            )
            if tail is Tail.OPEN or not answered:
                # the agent is still at it: its turn is taken once it is over (a turn taken
                # early would come back longer, under another key, and be written twice)
                self.skipped += len(turns.pop()[2])
        return turns


def _settled(path: Path) -> Tail:
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return Tail.SETTLED
    return Tail.FINISHED if age > SETTLED_SECONDS else Tail.SETTLED


def read(path: Path, *, tail: Tail | None = None, live: bool = False) -> Iterator[source.Record]:
    """The session of one transcript file, and the lines it could not read. ``tail`` says
    what to do with its last turn (default: :data:`Tail.SETTLED`, or :data:`Tail.FINISHED`
    once the file has been quiet for :data:`SETTLED_SECONDS`); ``live`` leaves a last line
    still being written for the next read."""
    entries: list[tuple[int, Mapping[str, Any]]] = []
    by_uuid: dict[str, Mapping[str, Any]] = {}
    lines: dict[str, int] = {}
    titles: dict[str, str] = {}
    for item in source.jsonl(path, live=live):
        if isinstance(item, source.Problem):
            yield item
            continue
        line, value = item
        if not isinstance(value, Mapping):
            yield source.Problem(str(path), line, "not a JSON object")
            continue
        kind = value.get("type")
        if kind == "custom-title" and isinstance(value.get("customTitle"), str):
            titles["custom"] = value["customTitle"]
        elif kind == "summary" and isinstance(value.get("summary"), str):
            titles[str(value.get("leafUuid"))] = value["summary"]
        uuid = value.get("uuid")
        if kind not in ("user", "assistant", "system") or not isinstance(uuid, str):
            continue
        if kind in MESSAGE_TYPES and not isinstance(value.get("message"), Mapping):
            yield source.Problem(str(path), line, f"{kind} record without a message object")
            continue
        by_uuid[uuid] = value
        lines[uuid] = line
        if kind in MESSAGE_TYPES:
            entries.append((line, value))
    if not entries:
        return
    # In a main transcript, inline subagent records (isSidechain) are not the conversation.
    main = [(line, e) for line, e in entries if not e.get("isSidechain")] or entries
    leaf = _latest(main)
    assert leaf is not None
    chain = _chain(by_uuid, leaf)
    converter = _Converter()
    for entry in chain:
        converter.take(entry, lines.get(str(entry.get("uuid"))))
    turns = converter.finish(tail or _settled(path))
    on_chain = sum(1 for e in chain if e.get("type") in MESSAGE_TYPES)
    skipped = converter.skipped + len(entries) - on_chain  # other branches, inline sidechains
    first = chain[0]
    session_id = str(first.get("sessionId") or path.name.removesuffix(".jsonl"))
    agent = first.get("agentId")
    subagent = path.name.startswith("agent-") or (
        isinstance(agent, str) and first.get("isSidechain")
    )
    session_key = session_id
    if subagent:
        agent_name = agent if isinstance(agent, str) else path.name.removesuffix(".jsonl")
        session_key = f"{session_id}/agent-{agent_name.removeprefix('agent-')}"
    model = next(
        (
            e["message"].get("model")
            for e in chain
            if e.get("type") == "assistant" and isinstance(e.get("message"), Mapping)
        ),
        None,
    )
    title = titles.get("custom") or next(
        (titles[u] for u in reversed([str(e.get("uuid")) for e in chain]) if u in titles), None
    )
    yield source.Session(
        source=SOURCE,
        session_key=session_key,
        metadata=convention.metadata(
            {
                "importer": SOURCE,
                "title": title,
                "cwd": leaf.get("cwd"),
                "git_branch": leaf.get("gitBranch"),
                "version": leaf.get("version"),
                "model": model if isinstance(model, str) else None,
                "parent_session": session_id if subagent else None,
            }
        ),
        turns=tuple(
            source.Turn(position=uuid, messages=tuple(messages), line=line)
            for uuid, line, messages in turns
        ),
        origin=str(path),
        skipped=skipped,
    )
