"""Claude Code transcripts: ``~/.claude/projects/<encoded cwd>/<sessionId>.jsonl``, and its
subagents' ``<sessionId>/subagents/agent-<id>.jsonl`` (older versions: ``agent-<id>.jsonl``
beside it).

Each line is a record with ``type``, ``uuid``, ``parentUuid``, ``sessionId``, ``timestamp``,
``cwd``, ``gitBranch``, ``version``, ``isSidechain``, ``isMeta`` and a ``message``. **A record is
the unit**: it is written once, whole, and never changes, so each record's messages are one
append keyed by its uuid (:func:`convention.unit_key`) — whenever it is read, by a hook
mid-turn or by ``sgme import`` of the final file, the same key. Records are read in file
order, the order they were said:

- user content is a string or blocks: ``text``, ``image`` (written ``[image]``) and
  ``tool_result`` (``tool_use_id``, ``content``) — a tool result in the convention, named after
  the ``tool_use`` it answers;
- an assistant record holds content blocks (one per record in current versions; the records
  of one API answer share ``message.id``): ``thinking`` and ``redacted_thinking`` (marked as
  thinking: the model's reasoning, not its answer), ``text``, ``tool_use`` {id, name, input} (a
  call with ``input`` as JSON and its id) — one message each, in the order written;
- the compaction's own summary (``isCompactSummary``) is kept, marked as a compaction summary;
- ``isMeta`` records (injected context, command caveats), records that are not messages
  (``summary``, ``file-history-snapshot``, ``system``, progress) and, in a main transcript, the
  inline subagent records of older versions (``isSidechain``) are left out, counted as skipped;
  a record whose uuid came before (a copy) is left out too.

**Rewinds.** The records form a tree through ``parentUuid``. A rewind ("fork from here", an
edited prompt) goes on from an earlier record; the branch it left stays in the file, and stays
in L0: L0 keeps what was said. Where a record goes on from a record before the end of the
branch being read, the messages of the records in between were taken back: a rewind marker
(:func:`convention.rewound`) is written before it, naming them. A compaction (a
``compact_boundary`` record without a parent) goes on from where it was. Branches are followed
through the last :data:`WINDOW` records; a rewind further back is not marked.

**Reading on.** What a :class:`Reader` knows after a record — the session, the calls awaiting
their results, the window of parents and the branch — is :meth:`Reader.state`, so live capture
reads only what a transcript gained since its last run and still makes exactly what ``sgme
import`` of the whole file makes.

Session key: the sessionId of the file's first record, so a resumed session (a new file that
copies the history, records keeping their sessionId and uuid) continues the same L0 file and its
copied records replay; a subagent's is ``{sessionId}/agent-{agentId}`` with the parent in its
metadata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.importers import convention, legacy, source

SOURCE = "claude-code"
MESSAGE_TYPES = ("user", "assistant")
#: records a reader remembers the parents of: a rewind to a record further back is not marked
WINDOW = 2048
#: calls a reader remembers the names of until their results come
CALLS = 1024
#: what marks the unit of a rewind marker (after the uuid of the record it comes before)
REWIND_POSITION = ":rewound"
#: metadata taken from the records: (metadata name, record field)
_FIELDS = (("cwd", "cwd"), ("git_branch", "gitBranch"), ("version", "version"))


def files(path: Path) -> list[Path]:
    """``path``, or every transcript (``.jsonl``) under a projects directory."""
    return source.walk(path, (".jsonl",))


class Reader:
    """A transcript read record by record (see the module docstring); ``state`` is what
    :meth:`state` returned after the records read before."""

    def __init__(self, path: Path, state: Mapping[str, Any] | None = None) -> None:
        found = dict(state or {})
        self.path = path
        self.session_key: str | None = found.get("session_key")
        self.parent_session: str | None = found.get("parent_session")
        self.subagent = bool(found.get("subagent", False))
        self.names: dict[str, str] = dict(found.get("names", {}))
        self.parents: dict[str, str | None] = dict(found.get("parents", {}))
        # the branch being read: record uuid -> [index of its first message, its message count]
        self.live: dict[str, list[int]] = {u: [a, b] for u, a, b in found.get("live", [])}
        self.emitted = int(found.get("emitted", 0))  #: messages made so far
        self.last_text: str | None = found.get("last_text")  #: the latest assistant text
        self.skipped = 0  #: messages and records left out on purpose, in this reading
        self.fields: dict[str, Any] = {}  #: what the session's metadata says, from this reading

    def state(self) -> dict[str, Any]:
        """What this reader knows, as JSON, to read on from later."""
        return {
            "session_key": self.session_key,
            "parent_session": self.parent_session,
            "subagent": self.subagent,
            "names": self.names,
            "parents": self.parents,
            "live": [[u, a, b] for u, (a, b) in self.live.items()],
            "emitted": self.emitted,
            "last_text": self.last_text,
        }

    def take(self, line: int, value: Any) -> list[source.Unit]:
        """The units one record makes (a rewind marker first, when it goes on from an earlier
        record); ``ValueError`` with the reason when the line is not a record."""
        if not isinstance(value, Mapping):
            raise ValueError("not a JSON object")
        kind = value.get("type")
        uuid = value.get("uuid")
        if isinstance(uuid, str):
            self._session(value)
        self._note(value)
        if kind in MESSAGE_TYPES and not isinstance(value.get("message"), Mapping):
            raise ValueError(f"{kind} record without a message object")
        if not isinstance(uuid, str):
            if kind in MESSAGE_TYPES:
                self.skipped += 1
            return []
        if uuid in self.parents or uuid in self.live:
            if kind in MESSAGE_TYPES:
                self.skipped += 1  # a copy of a record read before
            return []
        parent = value.get("parentUuid")
        boundary = kind == "system" and value.get("subtype") == "compact_boundary"
        self._remember(uuid, parent if isinstance(parent, str) and not boundary else None)
        if kind not in MESSAGE_TYPES:
            return []
        if value.get("isSidechain") and not self.subagent:
            self.skipped += 1  # an older version's inline subagent: not this conversation
            return []
        units = []
        when = convention.ts(value.get("timestamp"))
        places = self._rewound(parent if isinstance(parent, str) else None)
        if places:
            marker = convention.rewound(places, when)
            units.append(source.Unit(uuid + REWIND_POSITION, (marker,), line))
            self.emitted += 1
        messages = [part for m in self._messages(value, when) for part in convention.split_large(m)]
        self.live[uuid] = [self.emitted, len(messages)]
        while len(self.live) > WINDOW:
            del self.live[next(iter(self.live))]
        if messages:
            units.append(source.Unit(uuid, tuple(messages), line))
            self.emitted += len(messages)
        return units

    def _note(self, value: Mapping[str, Any]) -> None:
        """What the session's metadata takes from a record."""
        kind = value.get("type")
        if kind == "custom-title" and isinstance(value.get("customTitle"), str):
            self.fields["custom_title"] = value["customTitle"]
        elif kind == "summary" and isinstance(value.get("summary"), str):
            self.fields["summary"] = value["summary"]
        elif kind in MESSAGE_TYPES and (self.subagent or not value.get("isSidechain")):
            for name, field in (
                ("cwd", "cwd"),
                ("git_branch", "gitBranch"),
                ("version", "version"),
            ):
                if isinstance(value.get(field), str):
                    self.fields[name] = value[field]
            message = value.get("message")
            model = message.get("model") if isinstance(message, Mapping) else None
            if kind == "assistant" and isinstance(model, str):
                self.fields.setdefault("model", model)

    def _session(self, first: Mapping[str, Any]) -> None:
        """The session key, decided by the file's first record."""
        if self.session_key is not None:
            return
        session_id = first.get("sessionId")
        session_id = session_id if isinstance(session_id, str) and session_id else None
        session_id = session_id or self.path.name.removesuffix(".jsonl")
        agent = first.get("agentId")
        self.subagent = self.path.name.startswith("agent-") or (
            isinstance(agent, str) and bool(first.get("isSidechain"))
        )
        self.session_key = session_id
        if self.subagent:
            name = agent if isinstance(agent, str) else self.path.name.removesuffix(".jsonl")
            self.session_key = f"{session_id}/agent-{name.removeprefix('agent-')}"
            self.parent_session = session_id

    def _remember(self, uuid: str, parent: str | None) -> None:
        self.parents[uuid] = parent
        while len(self.parents) > WINDOW:
            del self.parents[next(iter(self.parents))]

    def _rewound(self, parent: str | None) -> list[int]:
        """The places (counted back from the next message) of the messages a record that goes
        on from ``parent`` takes back: those of the branch's records after the record it goes
        on from. None taken back when it goes on from the branch's end, from a record not
        known (before the window, unreadable) or from none."""
        walk = parent
        for _ in range(WINDOW):
            if walk is None or walk in self.live:
                break
            if walk not in self.parents:
                return []
            walk = self.parents[walk]
        if walk is None or walk not in self.live:
            return []
        places: list[int] = []
        while self.live and next(reversed(self.live)) != walk:
            _, (first, count) = self.live.popitem()
            places += [self.emitted - (first + k) for k in range(count)]
        return places

    def _messages(self, value: Mapping[str, Any], when: str | None) -> list[convention.Message]:
        message = value["message"]
        if value.get("isCompactSummary"):
            found = convention.summary(message.get("content"), when)
            return [found] if found is not None else []
        if value.get("isMeta"):
            self.skipped += 1
            return []
        if value.get("type") == "assistant":
            return self._assistant(message.get("content"), when)
        return self._user(message.get("content"), when)

    def _user(self, content: Any, when: str | None) -> list[convention.Message]:
        out: list[convention.Message] = []
        texts: list[str] = []

        def add_text() -> None:
            text = "\n".join(texts)
            if text.strip():
                out.append(convention.text_message("user", text, when))
            texts.clear()

        for block in content if isinstance(content, list) else [content]:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                add_text()
                answered = block.get("tool_use_id")
                name = self.names.get(str(answered), "tool")
                out.append(convention.tool_result(name, block.get("content"), when, answered))
            elif isinstance(block, Mapping) and block.get("type") == "image":
                texts.append("[image]")
            else:
                texts.append(convention.content_text(block))
        add_text()
        return out

    def _assistant(self, content: Any, when: str | None) -> list[convention.Message]:
        out: list[convention.Message] = []
        for block in content if isinstance(content, list) else [content]:
            if isinstance(block, str):
                block = {"type": "text", "text": block}
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                if block["text"].strip():
                    out.append(convention.text_message("assistant", block["text"], when))
                    self.last_text = block["text"].strip()
            elif kind == "tool_use":
                name = convention.tool_name(block.get("name"))
                if isinstance(block.get("id"), str):
                    self.names[block["id"]] = name
                    while len(self.names) > CALLS:
                        del self.names[next(iter(self.names))]
                out.append(convention.tool_call(name, block.get("input"), when, block.get("id")))
            elif kind in ("thinking", "redacted_thinking"):
                text = block.get("thinking") if kind == "thinking" else "[redacted]"
                found = convention.thinking(text, when)
                if found is not None:
                    out.append(found)
        return out

    def metadata(self) -> dict[str, Any]:
        """The session's metadata, from what this reading saw."""
        f = self.fields
        return convention.metadata(
            {
                "importer": SOURCE,
                "title": f.get("custom_title") or f.get("summary"),
                "cwd": f.get("cwd"),
                "git_branch": f.get("git_branch"),
                "version": f.get("version"),
                "model": f.get("model"),
                "parent_session": self.parent_session,
            }
        )

    def session(self, units: list[source.Unit], *, metadata: bool = True) -> source.Session:
        """The session of what was read (``metadata``: with the session's metadata, which
        only the append that makes the file keeps)."""
        return source.Session(
            source=SOURCE,
            session_key=self.session_key or self.path.name.removesuffix(".jsonl"),
            metadata=self.metadata() if metadata else {},
            units=tuple(units),
            origin=str(self.path),
            skipped=self.skipped,
            hashed=False,
        )


def legacy_units(
    path: Path, lines: list[source.Line], units: list[source.Unit]
) -> list[source.Unit]:
    """``units`` (read from the file's ``lines``, from its start), each with the key an
    earlier version gave its record's turn (:mod:`.legacy`; a rewind marker: the turn of the
    record it comes before)."""
    keys = legacy.claude_code(path, [line.value for line in lines])
    out = []
    for unit in units:
        found = keys.get(unit.position.removesuffix(REWIND_POSITION))
        out.append(unit if found is None else dataclasses.replace(unit, legacy_key=found))
    return out


def read(path: Path) -> Iterator[source.Record]:
    """The session of one transcript file, and the lines it could not read."""
    reader = Reader(path)
    units: list[source.Unit] = []
    lines: list[source.Line] = []
    for item in source.lines(path):
        if isinstance(item, source.Problem):
            yield item
            continue
        lines.append(item)
        try:
            units += reader.take(item.number, item.value)
        except ValueError as exc:
            yield source.Problem(str(path), item.number, str(exc), end=item.end)
    if reader.session_key is None:
        return
    yield reader.session(legacy_units(path, lines, units))
