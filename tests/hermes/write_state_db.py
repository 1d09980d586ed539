"""Writes Hermes transcripts into a ``state.db`` with Hermes' own SessionDB, row by row as the
agent persists its messages (``AIAgent._flush_messages_to_session_db``: role, content, tool
name, tool calls, tool call id, and the message's own timestamp when it has one; the system
prompt is the session's, not a row). Run with ``.venv-hermes/bin/python``.

Usage: ``write_state_db.py PATH`` with ``{"session id": [messages...]}`` on stdin.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hermes_state import SessionDB


def main() -> None:
    sessions = json.load(sys.stdin)
    db = SessionDB(db_path=Path(sys.argv[1]))
    try:
        for session_id, messages in sessions.items():
            db.create_session(session_id, "cli", model="model-a")
            for message in messages:
                if message["role"] == "system":
                    continue
                db.append_message(
                    session_id,
                    message["role"],
                    content=message.get("content"),
                    tool_name=message.get("tool_name"),
                    tool_calls=message.get("tool_calls"),
                    tool_call_id=message.get("tool_call_id"),
                    timestamp=message.get("timestamp"),
                )
    finally:
        db.close()


if __name__ == "__main__":
    main()
