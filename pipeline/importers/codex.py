"""Codex CLI rollouts: ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<id>.jsonl`` (or
``.jsonl.zst``), one session per file.

Each line is ``{"timestamp", "type", "payload"}``:

- ``session_meta`` — the session id (the session_key), cwd, originator, cli_version, source,
  git — the metadata;
- ``event_msg`` ``user_message`` — what the user typed (the ``response_item`` user messages
  repeat it, with injected context: environment, AGENTS.md);
- ``response_item`` ``message`` (role assistant) — assistant text; ``function_call`` /
  ``custom_tool_call`` (and any other ``*_call``) — a tool call in the convention, with its
  ``arguments`` (or ``input``) exactly as recorded and its ``call_id``; ``*_call_output`` — the
  tool result, named after its call, with the id it answers; ``reasoning`` (encrypted, or a
  summary of it) is left out;
- ``compacted`` — the summary a compaction wrote, kept as a compaction summary;
- ``event_msg`` ``task_started`` / ``task_complete`` / ``turn_aborted`` — turn boundaries with
  a ``turn_id``.

**An item is the unit**: each message is one append keyed by its turn and its place in the
turn (``codex:{session}:{turn}:{n}``, :func:`convention.unit_key`), the turn named by its
``turn_id`` when the rollout gave it before the turn's first item, else by its ordinal
(``n3``). Items are read in file order and never change, so a hook at any moment — a turn
still running, or one later aborted — and ``sgme import`` of the final file write each item
once, in the same place. A :class:`Reader` can be saved (:meth:`Reader.state`) and read on
from there (live capture reads only what a rollout gained).

Rollouts written before the envelope (until 2025-09) hold a bare session record (``id``,
``timestamp``, ``instructions``) on the first line and bare response items after it, and no
events: their user messages are the response items' (injected context left out), and a user
message after another starts the next turn.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.importers import convention, legacy, source

SOURCE = "codex"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
#: a user "message" that is one injected block, e.g. ``<environment_context>…</…>``
_INJECTED = re.compile(r"\s*<([A-Za-z_][\w-]*)[^>]*>.*</\1>\s*", re.S)
_INJECTED_PREFIXES = ("# AGENTS.md instructions", "<user_instructions>", "<environment_context>")
#: calls a reader remembers the names of until their results come
CALLS = 1024


def files(path: Path) -> list[Path]:
    """``path``, or every rollout (``.jsonl``, ``.jsonl.zst``) under a sessions directory."""
    return source.walk(path, (".jsonl", ".jsonl.zst"))


def _injected(text: str) -> bool:
    return text.lstrip().startswith(_INJECTED_PREFIXES) or bool(_INJECTED.fullmatch(text))


def _output_text(output: Any) -> str:
    """A call output: a string as recorded; ``{"content": …}`` (some versions) by its content."""
    if isinstance(output, Mapping) and "content" in output:
        return convention.content_text(output["content"])
    if isinstance(output, str):
        return convention.clean_text(output)
    return convention.arguments_text(output)


class Reader:
    """A rollout read line by line (see the module docstring); ``state`` is what
    :meth:`state` returned after the lines read before."""

    def __init__(self, path: Path, state: Mapping[str, Any] | None = None) -> None:
        found = dict(state or {})
        self.path = path
        self.session_id: str | None = found.get("session_id")
        self.session_key: str | None = found.get("session_key")  #: fixed by the first item
        #: the turn being read: its id, its position once an item was keyed, its items so far,
        #: whether task_started opened it, whether it has a user message
        self.turn: dict[str, Any] | None = found.get("turn")
        self.turns = int(found.get("turns", 0))  #: turns opened so far
        self.calls: dict[str, str] = dict(found.get("calls", {}))
        self.last_ts: str | None = found.get("last_ts")
        self.last_text: str | None = found.get("last_text")  #: the latest assistant text
        self.skipped = 0
        self.fields: dict[str, Any] = {}

    def state(self) -> dict[str, Any]:
        """What this reader knows, as JSON, to read on from later."""
        return {
            "session_id": self.session_id,
            "session_key": self.session_key,
            "turn": self.turn,
            "turns": self.turns,
            "calls": self.calls,
            "last_ts": self.last_ts,
            "last_text": self.last_text,
        }

    def _open(self, turn_id: str | None, *, started: bool) -> dict[str, Any]:
        self.turns += 1
        self.turn = {"id": turn_id, "position": None, "items": 0, "started": started, "user": 0}
        return self.turn

    def _unit(self, message: convention.Message | None, line: int) -> list[source.Unit]:
        """One item's unit in the current turn (one opened when there is none)."""
        if message is None:
            return []
        turn = self.turn if self.turn is not None else self._open(None, started=False)
        if turn["position"] is None:
            turn["position"] = turn["id"] or f"n{self.turns}"
        if self.session_key is None:
            found = _UUID.findall(self.path.name)
            fallback = found[-1] if found else self.path.name.split(".")[0]
            self.session_key = self.session_id or fallback
        position = f"{turn['position']}:{turn['items']}"
        turn["items"] += 1
        parts = tuple(convention.split_large(message))
        return [source.Unit(position, parts, line)]

    def _user(self, text: str, when: str | None, line: int) -> list[source.Unit]:
        turn = self.turn
        if turn is None or (turn["user"] and not turn["started"]):
            # without turn events, a user message starts the next turn
            turn = self._open(None, started=False)
        turn["user"] += 1
        return self._unit(convention.text_message("user", text, when), line)

    def _item(
        self, payload: Mapping[str, Any], when: str | None, line: int, *, bare: bool
    ) -> list[source.Unit]:
        """One response item (a message, a call, a call's output)."""
        kind = str(payload.get("type", ""))
        if kind == "message":
            role = payload.get("role")
            text = convention.content_text(payload.get("content"))
            if role == "assistant" and text.strip():
                self.last_text = text.strip()
                return self._unit(convention.text_message("assistant", text, when), line)
            if role == "user" and bare and text.strip() and not _injected(text):
                return self._user(text, when, line)
            return []
        if kind.endswith("_call_output"):
            answered = payload.get("call_id")
            name = self.calls.get(str(answered), kind.removesuffix("_output"))
            output = _output_text(payload.get("output"))
            return self._unit(convention.tool_result(name, output, when, answered), line)
        if kind.endswith("_call"):
            name = convention.tool_name(payload.get("name"), default=kind.removesuffix("_call"))
            arguments = next(
                (payload[f] for f in ("arguments", "input", "action") if f in payload), None
            )
            call_id = payload.get("call_id")
            if isinstance(call_id, str):
                self.calls[call_id] = name
                while len(self.calls) > CALLS:
                    del self.calls[next(iter(self.calls))]
            return self._unit(convention.tool_call(name, arguments, when, call_id), line)
        return []

    def _event(self, payload: Mapping[str, Any], when: str | None, line: int) -> list[source.Unit]:
        kind = payload.get("type")
        turn_id = payload.get("turn_id")
        turn_id = turn_id if isinstance(turn_id, str) and turn_id else None
        if kind == "task_started":
            self._open(turn_id, started=True)
        elif kind == "user_message":
            text = convention.content_text(payload.get("message"))
            if text.strip():
                return self._user(text, when, line)
        elif kind in ("task_complete", "turn_aborted"):
            self.turn = None
        return []

    def _meta(self, payload: Mapping[str, Any], when: str | None) -> None:
        if self.session_id is not None:
            return  # a resumed or forked rollout repeats its ancestors' meta after its own
        session_id = payload.get("id")
        if isinstance(session_id, str) and session_id:
            self.session_id = session_id
        git = payload.get("git")
        git = git if isinstance(git, Mapping) else {}
        self.fields.update(
            {
                "cwd": payload.get("cwd"),
                "originator": payload.get("originator"),
                "cli_version": payload.get("cli_version"),
                "source": payload.get("source") if isinstance(payload.get("source"), str) else None,
                "git_branch": git.get("branch"),
                "git_commit": git.get("commit_hash"),
                "repository_url": git.get("repository_url"),
                "started_at": when,
            }
        )

    def take(self, line: int, value: Any) -> list[source.Unit]:
        """The units one line makes; ``ValueError`` with the reason when it is not a rollout
        record."""
        if not isinstance(value, Mapping):
            raise ValueError("not a JSON object")
        if "payload" in value and "type" in value:
            when = convention.ts(value.get("timestamp")) or self.last_ts
            self.last_ts = when
            kind, payload = value["type"], value["payload"]
            if not isinstance(payload, Mapping):
                raise ValueError(f"{kind} record without an object payload")
            if kind == "session_meta":
                self._meta(payload, when)
            elif kind == "response_item":
                if payload.get("type") == "reasoning":
                    self.skipped += 1
                return self._item(payload, when, line, bare=False)
            elif kind == "event_msg":
                return self._event(payload, when, line)
            elif kind == "compacted":
                found = convention.summary(payload.get("message"), when)
                return self._unit(found, line)
            elif kind == "turn_context":
                model = payload.get("model")
                if isinstance(model, str):
                    self.fields.setdefault("model", model)
                turn_id = payload.get("turn_id")
                turn = self.turn
                if turn is not None and turn["id"] is None and isinstance(turn_id, str):
                    turn["id"] = turn_id or None  # names the turn if no item was keyed yet
            return []
        # before the envelope: a bare session record, state records, bare response items
        if "record_type" in value:
            return []
        if "type" not in value and "id" in value and self.session_id is None:
            self._meta(value, convention.ts(value.get("timestamp")))
            self.last_ts = convention.ts(value.get("timestamp"))
            return []
        if isinstance(value.get("type"), str):
            if value["type"] == "reasoning":
                self.skipped += 1
            return self._item(value, self.last_ts, line, bare=True)
        raise ValueError("neither a rollout record nor a response item")

    def metadata(self) -> dict[str, Any]:
        """The session's metadata, from what this reading saw."""
        return convention.metadata({"importer": SOURCE, **self.fields})

    def session(self, units: list[source.Unit], *, metadata: bool = True) -> source.Session:
        """The session of what was read (``metadata``: see claude_code.Reader.session)."""
        return source.Session(
            source=SOURCE,
            session_key=self.session_key or self.session_id or self.path.name.split(".")[0],
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
    earlier version gave its item's turn (:mod:`.legacy`)."""
    keys = legacy.codex(path, [(line.number, line.value) for line in lines])
    out = []
    for unit in units:
        found = keys.get(unit.line) if unit.line is not None else None
        out.append(unit if found is None else dataclasses.replace(unit, legacy_key=found))
    return out


def read(path: Path) -> Iterator[source.Record]:
    """The session of one rollout file, and the lines it could not read."""
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
    if not units and not reader.skipped:
        return
    yield reader.session(legacy_units(path, lines, units))
