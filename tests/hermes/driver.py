"""Drives the sgme provider through Hermes' own plugin loader and MemoryManager.

Run with ``.venv-hermes/bin/python`` (the real hermes-agent), ``HERMES_HOME`` set to a home
whose ``plugins/sgme/`` holds the provider. Reads one JSON command per line on stdin and
answers each with one line ``@@ {json}`` on stdout (Hermes may print other things).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from agent.memory_manager import MemoryManager
from hermes_state import SessionDB
from plugins.memory import (
    _get_active_memory_provider,
    discover_memory_providers,
    load_memory_provider,
)

HOME = Path(os.environ["HERMES_HOME"])
manager = MemoryManager()
_db: list[SessionDB] = []


def state_db() -> SessionDB:
    """Hermes' own ``$HERMES_HOME/state.db``, as the agent keeps it."""
    if not _db:
        _db.append(SessionDB(db_path=HOME / "state.db"))
    return _db[0]


def run(command: dict[str, Any]) -> dict[str, Any]:
    op = command["op"]
    if op == "load":
        found = [(name, available) for name, _, available in discover_memory_providers()]
        provider = load_memory_provider("sgme")
        assert provider is not None, "Hermes' loader did not find the sgme provider"
        manager.add_provider(provider)
        return {
            "discovered": found,
            "active": _get_active_memory_provider(),
            "name": provider.name,
            "class": type(provider).__name__,
            "module": type(provider).__module__,
            "available": provider.is_available(),
        }
    if op == "init":
        manager.initialize_all(
            session_id=command["session_id"],
            platform="cli",
            agent_context=command.get("agent_context", "primary"),
        )
        return {}
    if op == "turn":
        manager.sync_all(
            command["user"],
            command["assistant"],
            session_id=command.get("session_id", ""),
            messages=command.get("messages"),
        )
        return {"drained": manager.flush_pending(timeout=30)}
    if op == "switch":
        manager.on_session_switch(
            command["session_id"], parent_session_id=command.get("parent", "")
        )
        return {}
    if op == "persist":
        # what AIAgent._flush_messages_to_session_db writes for the turn's new messages
        db = state_db()
        session_id = command["session_id"]
        if db.get_session(session_id) is None:
            db.create_session(session_id, "cli", model="model-a")
        for message in command["messages"]:
            db.append_message(
                session_id,
                message["role"],
                content=message.get("content"),
                tool_name=message.get("tool_name"),
                tool_calls=message.get("tool_calls"),
                tool_call_id=message.get("tool_call_id"),
                timestamp=message.get("timestamp"),
            )
        return {}
    if op == "undo":
        # what the CLI's /undo N does (HermesCLI.undo_last): the rows from the N-th last user
        # message on soft-deleted, and the memory providers told of the rewind
        db = state_db()
        session_id = command["session_id"]
        n = command.get("n", 1)
        recents = db.list_recent_user_messages(session_id, limit=max(n, 10))
        target = recents[min(n - 1, len(recents) - 1)]["id"]
        done = db.rewind_to_message(session_id, target)
        manager.on_session_switch(session_id, parent_session_id="", reset=False, rewound=True)
        return {"rewound_rows": done["rewound_count"]}
    if op == "compact":
        # an in-place compaction: the history soft-archived, the compacted set inserted live,
        # and the memory providers told, under the same session id (conversation_compression)
        session_id = command["session_id"]
        state_db().archive_and_compact(session_id, command["messages"])
        manager.on_session_switch(
            session_id, parent_session_id=session_id, reset=False, reason="compression"
        )
        return {}
    if op == "end":
        manager.on_session_end(command.get("messages", []))
        return {}
    if op == "prefetch":
        started = time.monotonic()
        text = manager.prefetch_all(command["query"], session_id=command.get("session_id", ""))
        return {"text": text, "seconds": time.monotonic() - started}
    if op == "queue_prefetch":
        manager.queue_prefetch_all(command["query"], session_id=command.get("session_id", ""))
        return {"drained": manager.flush_pending(timeout=30)}
    if op == "tools":
        return {
            "names": sorted(manager.get_all_tool_names()),
            "system_prompt": manager.build_system_prompt(),
        }
    if op == "tool":
        started = time.monotonic()
        answer = manager.handle_tool_call(command["name"], command["args"])
        return {"result": json.loads(answer), "seconds": time.monotonic() - started}
    if op == "spool":
        spool = HOME / "sgme" / "spool"
        if not spool.is_dir():
            return {"pending": []}
        names = [p.name for p in spool.iterdir() if p.name.endswith((".json", ".jsonl"))]
        return {"pending": sorted(names)}
    if op == "shutdown":
        manager.shutdown_all()
        if _db:
            _db.pop().close()
        return {"drain": manager.shutdown_drain_state}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = {"ok": True, **run(json.loads(line))}
        except Exception:
            answer = {"ok": False, "error": traceback.format_exc()}
        print("@@ " + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
