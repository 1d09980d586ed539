"""Reading SGME L0 back for the Hermes provider: searches (``GET /v1/search``) and opened
source_refs (``GET /v1/refs/{file_id}:{seq}``), each bounded by a deadline, so that a slow or
absent server costs the agent that much time at most, and never an exception it did not ask
for. httpx and the standard library only (the provider runs in Hermes' environment).

SGME's search ranks the messages by how well they answer the query (``match=any``, its
default: stemmed words, BM25, the turn after a match; SGME's docs/search.md), so a recall is one
request: the user's message as it is.

What the agent sees of it is here too: the block recalled before a turn (:func:`render`) and
the ``sgme_search`` and ``sgme_open`` tools (their schemas and answers).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx

#: seconds to wait for a connection at most (loopback or a LAN: a refusal comes at once)
CONNECT_TIMEOUT = 0.5
MAX_QUERY = 1000  #: characters of ``q`` the server takes
MAX_LIMIT = 100  #: hits one search may ask for
#: hits asked for per wanted hit: some may be left out afterwards (the current session's
#: latest turns)
OVERFETCH = 3


class Unavailable(Exception):
    """SGME did not answer in time, or refused: the message says which and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def parse_ts(text: Any) -> dt.datetime | None:
    """The aware datetime of an L0 timestamp (``2026-08-03T11:18:06.5Z``); None if it is not."""
    if not isinstance(text, str):
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


class Reader:
    """Searches and opens source_refs of one SGME server, for one agent_id."""

    def __init__(self, config: dict[str, str]) -> None:
        self.agent_id = config["agent_id"]
        headers = {}
        if config["token"]:
            headers["Authorization"] = "Bearer " + config["token"]
        self._client = httpx.Client(base_url=config["url"], headers=headers)

    def _get(self, path: str, params: dict[str, Any], deadline: float) -> Any:
        """The JSON answer of one GET, or :class:`Unavailable` (also when ``deadline``, a
        ``time.monotonic()`` value, passes first)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unavailable("no time left to ask SGME")
        timeout = httpx.Timeout(left, connect=min(CONNECT_TIMEOUT, left))
        try:
            answer = self._client.get(path, params=params, timeout=timeout)
        except httpx.HTTPError as exc:
            raise Unavailable(f"SGME at {self._client.base_url} did not answer: {exc!r}") from exc
        if answer.status_code != 200:
            detail = answer.text[:300]
            with contextlib.suppress(ValueError, AttributeError):
                detail = str(answer.json().get("detail", detail))
            if answer.status_code == 401:
                detail += " (SGME_TOKEN is missing or not valid)"
            elif answer.status_code == 403:
                detail += f" (SGME_TOKEN needs the read scope for agent {self.agent_id})"
            raise Unavailable(f"SGME answered {answer.status_code}: {detail}", answer.status_code)
        try:
            return answer.json()
        except ValueError as exc:
            raise Unavailable(f"SGME answered what is not JSON: {answer.text[:200]!r}") from exc

    def search(self, q: str, *, limit: int, deadline: float, **filters: Any) -> list[Any]:
        """The hits of one search of this agent's messages, best first."""
        params = {"q": q[:MAX_QUERY], "agent_id": self.agent_id, "limit": min(limit, MAX_LIMIT)}
        params.update({k: v for k, v in filters.items() if v not in (None, "")})
        found = self._get("/v1/search", params, deadline)
        hits = found.get("hits") if isinstance(found, dict) else None
        if not isinstance(hits, list):
            raise Unavailable("SGME's search answer has no hits")
        return [h for h in hits if isinstance(h, dict) and isinstance(h.get("source_ref"), str)]

    def recall(
        self,
        query: str,
        *,
        limit: int,
        deadline: float,
        keep: Callable[[dict[str, Any]], bool] = lambda hit: True,
        **filters: Any,
    ) -> list[Any]:
        """Up to ``limit`` hits for ``query`` that ``keep`` accepts, best first: one ranked
        search (its failure is raised)."""
        if not query.strip():
            return []
        fetch = min(MAX_LIMIT, limit * OVERFETCH)
        found = self.search(query, limit=fetch, deadline=deadline, match="any", **filters)
        return [hit for hit in found if keep(hit)][:limit]

    def open(self, source_ref: str, *, context: int, deadline: float) -> Any:
        """The message ``source_ref`` names with ``context`` neighbours a side (``Ref``)."""
        path = "/v1/refs/" + urllib.parse.quote(source_ref.strip(), safe=":")
        found = self._get(path, {"context": context}, deadline)
        if not isinstance(found, dict) or not isinstance(found.get("message"), dict):
            raise Unavailable("SGME's ref answer has no message")
        return found

    def close(self) -> None:
        self._client.close()


# ---------------------------------------------------------------------------------------------
# what the agent sees: the recalled block and the tools

TOOL_TIMEOUT = 5.0  #: seconds a tool call may take
SEARCH_HITS = 10  #: hits sgme_search gives unless asked for another number
MAX_SEARCH_HITS = 50
MAX_OPEN_CONTEXT = 10  #: neighbours a side sgme_open shows at most
MAX_OPEN_CHARS = 4000  #: characters of each message sgme_open shows; the rest is cut

SEARCH_TOOL: dict[str, Any] = {
    "name": "sgme_search",
    "description": (
        "Search every earlier conversation with this user, stored verbatim in SGME L0 (all "
        "sessions, tool calls and results too). Returns hits best first, each with a snippet, "
        "its source_ref, time, role and session; sgme_open shows a hit in full."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": (
                    'A question, a few words (any language) or a "quoted phrase". The '
                    "messages that best answer it come first; they need not hold every word."
                ),
            },
            "session": {"type": "string", "description": "Only this session (a hit's session)."},
            "role": {"type": "string", "enum": ["user", "assistant", "tool", "system"]},
            "since": {"type": "string", "description": "Only from this time (RFC 3339)."},
            "until": {"type": "string", "description": "Only up to this time (RFC 3339)."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_HITS},
        },
        "required": ["query"],
    },
}
OPEN_TOOL: dict[str, Any] = {
    "name": "sgme_open",
    "description": (
        "Show the message a source_ref names (from sgme_search or the recalled context), "
        "whole, with the messages just before and after it in its session."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "source_ref": {"type": "string", "description": "file_id:seq, as a hit gives it"},
            "context": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_OPEN_CONTEXT,
                "description": "Messages to show on each side (default 2).",
            },
        },
        "required": ["source_ref"],
    },
}


def render(hits: list[dict[str, Any]]) -> str:
    """The recalled block: one line per hit, with its time, role, session and source_ref."""
    if not hits:
        return ""
    lines = [
        "Earlier conversations in SGME L0 that may bear on this (snippets, times in UTC; "
        "sgme_open with a source_ref shows the message whole, with its neighbours):"
    ]
    for hit in hits:
        when = str(hit.get("ts", ""))[:16].replace("T", " ")
        snippet = " ".join(str(hit.get("snippet", "")).split())
        lines.append(
            f"- {when} {hit.get('role')}, session {hit.get('session_key')} "
            f"[{hit['source_ref']}]: {snippet}"
        )
    return "\n".join(lines)


def _bounded(value: Any, default: int, low: int, high: int) -> int:
    """An integer argument of a tool call, within ``low..high``; ``default`` if it is none."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return max(low, min(high, number))


def _shown(message: dict[str, Any]) -> dict[str, Any]:
    """A message as sgme_open shows it: its content cut at :data:`MAX_OPEN_CHARS`."""
    content = str(message.get("content", ""))
    shown = {
        "source_ref": message.get("source_ref"),
        "time": message.get("ts"),
        "role": message.get("role"),
        "content": content[:MAX_OPEN_CHARS],
    }
    if message.get("tool_name"):
        shown["tool_name"] = message["tool_name"]
    if len(content) > MAX_OPEN_CHARS:
        shown["cut"] = f"{len(content) - MAX_OPEN_CHARS} more characters not shown"
    return shown


def search_tool(reader: Reader, args: dict[str, Any]) -> dict[str, Any]:
    """The answer of an ``sgme_search`` call: the hits, each with its source_ref, time, role,
    session and snippet."""
    query = str(args.get("query") or "").strip()
    if not query:
        return {"error": "query is required: a few words to look for"}
    hits = reader.recall(
        query,
        limit=_bounded(args.get("limit"), SEARCH_HITS, 1, MAX_SEARCH_HITS),
        deadline=time.monotonic() + TOOL_TIMEOUT,
        session_key=args.get("session"),
        role=args.get("role"),
        since=args.get("since"),
        until=args.get("until"),
    )
    shown = [
        {
            "source_ref": hit["source_ref"],
            "time": hit.get("ts"),
            "role": hit.get("role"),
            "session": hit.get("session_key"),
            "snippet": hit.get("snippet", ""),
        }
        for hit in hits
    ]
    return {"query": query, "count": len(shown), "hits": shown}


def open_tool(reader: Reader, args: dict[str, Any]) -> dict[str, Any]:
    """The answer of an ``sgme_open`` call: the message and its neighbours, in order."""
    ref = str(args.get("source_ref") or "").strip()
    if not ref:
        return {"error": "source_ref is required (file_id:seq, as a hit gives it)"}
    found = reader.open(
        ref,
        context=_bounded(args.get("context"), 2, 0, MAX_OPEN_CONTEXT),
        deadline=time.monotonic() + TOOL_TIMEOUT,
    )
    around = [*found.get("before", []), found["message"], *found.get("after", [])]
    return {
        "source_ref": found.get("source_ref", ref),
        "session": found.get("session_key"),
        "source_type": found.get("source_type"),
        "messages": [_shown(m) for m in around if isinstance(m, dict)],
    }
