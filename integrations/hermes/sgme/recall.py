"""Reading SGME L0 back for the Hermes provider: searches (``GET /v1/search``) and opened
source_refs (``GET /v1/refs/{file_id}:{seq}``), each bounded by a deadline, so that a slow or
absent server costs the agent that much time at most, and never an exception it did not ask
for. httpx and the standard library only (the provider runs in Hermes' environment).

SGME's search finds the messages that contain *every* word of a query. A user's message
rarely shares all its words with what was said before ("What tea do I like?" against "I
prefer green tea"), so :meth:`Reader.recall` searches for a query's keywords together first,
then for each keyword alone, and ranks what it found: the messages that matched every
keyword first, then the ones that matched the most specific keywords (a keyword that found
few messages weighs more than one that found many).

What the agent sees of it is here too: the block recalled before a turn (:func:`render`) and
the ``sgme_search`` and ``sgme_open`` tools (their schemas and answers).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import httpx

#: seconds to wait for a connection at most (loopback or a LAN: a refusal comes at once)
CONNECT_TIMEOUT = 0.5
MAX_QUERY = 1000  #: characters of ``q`` the server takes
MAX_LIMIT = 100  #: hits one search may ask for
MAX_KEYWORDS = 6  #: keywords searched alone, at most (each is one request)
#: hits asked for per wanted hit: some may be left out afterwards (the current session's
#: latest turns), and the keyword searches need room to overlap
OVERFETCH = 3

# Scripts written without spaces between words (SGME's pipeline.terms uses the same ranges):
# the server finds any two adjacent characters of them, so a run becomes its pairs.
_CJK = (
    "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\uac00-\ud7af\u1100-\u11ff\u3130-\u318f\uff66-\uff9f\U00020000-\U0003134f"
)
_TOKEN = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")
#: words that say nothing about what a message was about
_STOPWORDS = """
    a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing done down during
    each else ever few for from further get got had has have having he her here hers
    herself him himself his how i if in into is it its itself just let me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own
    please same she should so some such than that the their theirs them themselves then
    there these they this those through to too under until up us very was we were what
    when where which while who whom why will with would you your yours yourself
    yourselves tell told say said know remember recall think thought want wanted need
    one ones thing things something anything earlier last time
    什么 怎么 为什 我们 你们 他们 一个 这个 那个 是不 不是 可以 没有 记得 之前 以前
"""
STOPWORDS = frozenset(_STOPWORDS.split())


class Unavailable(Exception):
    """SGME did not answer in time, or refused: the message says which and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def keywords(text: str) -> list[str]:
    """The words of ``text`` worth searching for, the longest first: no stop words and no
    one-letter words; a run of CJK characters gives its two-character pieces."""
    found: dict[str, None] = {}
    for match in _TOKEN.finditer(unicodedata.normalize("NFKC", text).casefold()):
        cjk, word = match.groups()
        if cjk:
            pieces = [cjk] if len(cjk) == 1 else [cjk[i : i + 2] for i in range(len(cjk) - 1)]
        else:
            pieces = [word] if len(word) > 1 else []
        for piece in pieces:
            if piece not in STOPWORDS:
                found.setdefault(piece, None)
    return sorted(found, key=len, reverse=True)[:MAX_KEYWORDS]


def rank(together: list[dict[str, Any]], alone: Iterable[list[dict[str, Any]]]) -> list[Any]:
    """One list from the hits of the search for every keyword (``together``) and of each
    keyword's own search (``alone``): ``together``'s first, in order; then by the summed
    weight of the keywords that found a hit (1 / how many hits the keyword found), then by
    its best place in a keyword's list. Each hit once, with ``partial`` set on the second
    kind."""
    seen: dict[str, dict[str, Any]] = {}
    for hit in together:
        seen.setdefault(hit["source_ref"], dict(hit, partial=False))
    weight: dict[str, float] = {}
    place: dict[str, int] = {}
    for hits in alone:
        for n, hit in enumerate(hits):
            ref = hit["source_ref"]
            if ref in seen and not seen[ref]["partial"]:
                continue
            seen.setdefault(ref, dict(hit, partial=True))
            weight[ref] = weight.get(ref, 0.0) + 1.0 / len(hits)
            place[ref] = min(place.get(ref, n), n)
    first = [hit for hit in seen.values() if not hit["partial"]]
    rest = sorted(
        (hit for hit in seen.values() if hit["partial"]),
        key=lambda hit: (-weight[hit["source_ref"]], place[hit["source_ref"]]),
    )
    return first + rest


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
        exact: bool = False,
        **filters: Any,
    ) -> list[Any]:
        """Up to ``limit`` hits for ``query`` that ``keep`` accepts, ranked as the module
        docstring says. ``exact``: search for ``query`` as written first (its quoted phrases
        stay phrases), else for its keywords. The first search's failure is raised; when a
        later one fails (the deadline), what was found so far is the answer."""
        words = keywords(query)
        first = query if exact else " ".join(words)
        if not first.strip():
            return []
        fetch = min(MAX_LIMIT, limit * OVERFETCH)
        together = self.search(first, limit=fetch, deadline=deadline, **filters)
        alone: list[list[dict[str, Any]]] = []
        if len([h for h in together if keep(h)]) < limit and len(words) > 1:
            for word in words:
                try:
                    alone.append(self.search(word, limit=fetch, deadline=deadline, **filters))
                except Unavailable:
                    break
        return [hit for hit in rank(together, alone) if keep(hit)][:limit]

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
                    'A few distinctive words (any language) or a "quoted phrase". Messages '
                    "with all of them come first; when there are few, messages with some of "
                    "them follow, marked partial."
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
    session and snippet (``partial`` when it lacks some of the words)."""
    query = str(args.get("query") or "").strip()
    if not query:
        return {"error": "query is required: a few words to look for"}
    hits = reader.recall(
        query,
        limit=_bounded(args.get("limit"), SEARCH_HITS, 1, MAX_SEARCH_HITS),
        deadline=time.monotonic() + TOOL_TIMEOUT,
        exact=True,
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
            **({"partial": True} if hit.get("partial") else {}),
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
