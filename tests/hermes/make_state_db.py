"""Writes a Hermes ``state.db`` with Hermes' own SessionDB (run with ``.venv-hermes/bin/python``).

Usage: ``make_state_db.py PATH``. Prints ``{"sessions": [...], "schema_version": N}``.

The database holds what the importer has to handle: a finished session with a tool call and
structured (multimodal) content, rewound by /undo and continued; a session compacted in place
(its history soft-archived, a summary and a kept tail inserted as live rows) and still running
with an unanswered question; and a child session of the first one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hermes_state
from hermes_state import SessionDB

T0 = 1785755886.0  # 2026-08-03T11:18:06Z


def main() -> None:
    path = Path(sys.argv[1])
    db = SessionDB(db_path=path)
    try:
        db.create_session("s1", "cli", model="model-a", cwd="/src/app")
        db.set_session_title("s1", "Listing files")
        db.append_message(
            "s1",
            "user",
            content=[
                {"type": "text", "text": "list files"},
                {"type": "image_url", "image_url": {"url": "data:"}},
            ],
            timestamp=T0 + 1,
        )
        calls = [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
            }
        ]
        db.append_message("s1", "assistant", content="", tool_calls=calls, timestamp=T0 + 2)
        db.append_message(
            "s1", "tool", content="a.txt", tool_name="terminal", tool_call_id="c1", timestamp=T0 + 3
        )
        db.append_message("s1", "assistant", content="One file: a.txt", timestamp=T0 + 4)
        undone = db.append_message("s1", "user", content="delete it", timestamp=T0 + 5)
        db.append_message("s1", "assistant", content="Deleted.", timestamp=T0 + 6)
        db.rewind_to_message("s1", undone)  # /undo: the last exchange is taken back
        db.append_message("s1", "user", content="copy it", timestamp=T0 + 7)
        db.append_message("s1", "assistant", content="Copied.", timestamp=T0 + 8)
        db.end_session("s1", "user_exit")

        db.create_session("s2", "telegram", model="model-b", parent_session_id="s1")
        db.append_message("s2", "user", content="first", timestamp=T0 + 100)
        db.append_message("s2", "assistant", content="one", timestamp=T0 + 101)
        db.append_message("s2", "user", content="second", timestamp=T0 + 102)
        db.append_message("s2", "assistant", content="two", timestamp=T0 + 103)
        db.archive_and_compact(
            "s2",
            [
                {"role": "user", "content": "[summary] first/one", "timestamp": T0 + 104},
                {"role": "assistant", "content": "Noted.", "timestamp": T0 + 105},
                {"role": "user", "content": "second", "timestamp": T0 + 102},
                {"role": "assistant", "content": "two", "timestamp": T0 + 103},
            ],
        )
        db.append_message("s2", "user", content="third", timestamp=T0 + 106)
        db.append_message("s2", "assistant", content="three", timestamp=T0 + 107)
        db.append_message("s2", "user", content="still thinking?", timestamp=T0 + 108)
    finally:
        db.close()
    print(json.dumps({"sessions": ["s1", "s2"], "schema_version": hermes_state.SCHEMA_VERSION}))


if __name__ == "__main__":
    main()
