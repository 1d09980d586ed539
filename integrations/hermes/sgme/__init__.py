"""SGME L0 as a Hermes Agent memory provider: every completed turn, appended to SGME.

Install: ``sgme hermes install`` copies this directory to ``$HERMES_HOME/plugins/sgme/``;
enable it with ``memory.provider: sgme`` in Hermes' ``config.yaml``.

Configuration (environment first, then ``$HERMES_HOME/sgme.json`` written by
``hermes memory setup``, then defaults): ``SGME_URL`` (``http://127.0.0.1:8765``),
``SGME_TOKEN`` (sent as ``Authorization: Bearer``), ``SGME_AGENT_ID`` (``hermes``).

What it does:

- ``sync_turn`` appends exactly that turn — the user message, each assistant tool call, each
  tool result, the final assistant message, in SGME's tool-call convention (``convention.py``,
  the importers' own module) — to the session file whose session_key is Hermes' session id,
  with the messages' own times (the time the turn completed for those that carry none). The
  idempotency key is ``convention.hermes_key``: the session, the turn's number (its user
  message's ordinal in the transcript) and a hash of what it says, without times — the key
  ``sgme import hermes`` gives the same turn read from ``state.db``, so a turn sent twice, or
  imported too, is written once.
- It never blocks or breaks the agent: a turn is written to a local spool
  (``$HERMES_HOME/sgme/spool/``, ``spool.py``: private, ordered, bounded by
  ``SGME_SPOOL_MAX_BYTES``, its secrets redacted by ``redactor.py`` — SGME's own rules, copied
  beside it) and a background thread sends it with short timeouts
  (``sender.py``). What the server could not take stays there, in order, and goes at the next
  turn, at ``on_session_end`` and at ``shutdown``. A turn the server refuses for good
  (invalid, too large, or 403: not this token's agent) is set aside in ``spool/rejected/`` for
  a person to look at and the rest goes on; nothing is silently dropped. A turn that was
  erased from SGME (its key is the erasure's tombstone) is not stored again, and the log says
  so.
- No writes for ``agent_context`` ``cron``, ``flush`` or ``subagent`` (as Hermes' own
  providers do). ``on_session_switch`` starts a new session_key; the spool keeps what was
  queued for the old one.
- A rewind (``/undo``: ``on_session_switch(rewound=True)``, which does not say how far back)
  leaves what was stored in L0; the next turn's number says how far back it went, and a rewind
  marker naming the messages of the turns this process stored from that number on (since the
  last compaction) is appended before that turn — the marker ``sgme import hermes`` writes
  there.
- Recall: before each turn ``prefetch`` searches this agent's messages in SGME for the
  user's message, ranked (one ``GET /v1/search``, at most :data:`PREFETCH_TIMEOUT` seconds)
  and returns the best few hits, each with its ``source_ref``, leaving out the current
  session's latest turns (Hermes has them in context); ``queue_prefetch``, which Hermes runs
  after a turn on its background worker, searches for that turn's words for the next one.
  When SGME is down, slow or refuses (a token without the ``read`` scope), the answer is
  empty: recall never holds up or breaks a turn. The ``sgme_search`` tool searches on the
  model's request and ``sgme_open`` shows a source_ref with the messages around it
  (``GET /v1/refs``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.memory_provider import MemoryProvider

from . import messages as turns
from . import recall, sender

if TYPE_CHECKING:
    # ``sgme hermes install`` puts these modules of SGME's package beside this one: checked
    # against them, imported from beside it (Hermes' environment has no SGME package).
    from pipeline import redactor
    from pipeline.capture import spool as spooling
    from pipeline.importers import chat, convention
else:
    from . import chat, convention, redactor
    from . import spool as spooling

try:
    import httpx
except ImportError:  # pragma: no cover - Hermes ships httpx; is_available() says so if not
    httpx = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8765"
DEFAULT_AGENT_ID = "hermes"
SKIP_CONTEXTS = ("cron", "flush", "subagent")
CONFIG_FILE = "sgme.json"
DRAIN_TIMEOUT = sender.DRAIN_TIMEOUT
#: keys remembered as sent in this process (a replayed turn is not even spooled again)
REMEMBERED_KEYS = 4096
#: seconds the recall before a turn may take: Hermes waits for it before calling the model
PREFETCH_TIMEOUT = 1.5
#: seconds the recall for the next turn may take (on Hermes' background worker)
BACKGROUND_TIMEOUT = 3.0
PREFETCH_HITS = 5  #: hits in the recalled block before a turn
#: the current session's latest turns that recall leaves out: Hermes has them in context (its
#: compressor keeps at least the last 20 messages as they are)
RECENT_TURNS = 5
RECENT_SESSIONS = 64  #: sessions whose latest turns are remembered (a gateway serves many)


def load_config(hermes_home: Path) -> dict[str, Any]:
    """url, token and agent_id: environment, then ``sgme.json``, then defaults; the spool's
    bound from ``SGME_SPOOL_MAX_BYTES`` (bytes, default 256 MiB)."""
    stored: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        stored = json.loads((hermes_home / CONFIG_FILE).read_text(encoding="utf-8"))
    if not isinstance(stored, dict):
        stored = {}
    env = os.environ
    return {
        "url": (env.get("SGME_URL") or stored.get("url") or DEFAULT_URL).rstrip("/"),
        "token": env.get("SGME_TOKEN") or stored.get("token") or "",
        "agent_id": env.get("SGME_AGENT_ID") or stored.get("agent_id") or DEFAULT_AGENT_ID,
        "spool_max_bytes": _bytes(env.get("SGME_SPOOL_MAX_BYTES"), spooling.DEFAULT_MAX_BYTES),
    }


def _bytes(value: str | None, default: int) -> int:
    try:
        found = int(value) if value else default
    except ValueError:
        logger.warning("sgme: SGME_SPOOL_MAX_BYTES=%r is not a number of bytes", value)
        return default
    return found if found > 0 else default


class SgmeMemoryProvider(MemoryProvider):  # type: ignore[misc]  # Hermes' class, untyped here
    """Appends every completed Hermes turn to SGME L0 and recalls earlier ones (see the module
    docstring)."""

    def __init__(self) -> None:
        self._config: dict[str, Any] = {}
        self._session_id = ""
        self._writes = True
        self._metadata: dict[str, Any] = {}
        self._sender: sender.Sender | None = None
        self._reader: recall.Reader | None = None
        self._sent: OrderedDict[str, None] = OrderedDict()
        self._turns = 0
        # session -> its turns as stored by this process (to mark a rewind), latest last
        self._branches: OrderedDict[str, chat.Branch] = OrderedDict()
        self._rewound: set[str] = set()  # sessions Hermes rewound since their last turn
        # session -> when each of its latest turns began (recall leaves those out)
        self._recent: OrderedDict[str, deque[dt.datetime]] = OrderedDict()
        # what queue_prefetch found for the next turn: (session, hits)
        self._queued: tuple[str, list[dict[str, Any]]] | None = None
        self._lock = threading.Lock()
        self._recall_failing = False

    @property
    def name(self) -> str:
        return "sgme"

    def is_available(self) -> bool:
        return httpx is not None

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        home = Path(
            kwargs.get("hermes_home") or os.environ.get("HERMES_HOME") or Path.home() / ".hermes"
        )
        self._config = load_config(home)
        self._session_id = session_id
        self._writes = kwargs.get("agent_context", "primary") not in SKIP_CONTEXTS
        self._metadata = {
            k: v
            for k, v in {
                "client": "hermes-sgme-provider",
                "platform": kwargs.get("platform"),
                "profile": kwargs.get("agent_identity"),
            }.items()
            if isinstance(v, str) and v
        }
        if self._sender is None:
            spool = spooling.Spool(
                home / "sgme" / "spool",
                max_bytes=self._config["spool_max_bytes"],
                # no credential waits in clear on this disk (the server redacts again)
                scrub=spooling.scrubber(redactor.redact),
            )
            self._sender = sender.Sender(self._config, spool)
            self._sender.start()
            self._sender.kick()  # what an earlier run could not deliver
        if self._reader is None:
            self._reader = recall.Reader(self._config)

    def system_prompt_block(self) -> str:
        return (
            "# SGME L0\nEvery earlier conversation with this user is kept verbatim in SGME. "
            "Snippets that may bear on the user's message are recalled before each turn; "
            "sgme_search finds more by words, sgme_open shows a source_ref in full."
        )

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [recall.SEARCH_TOOL, recall.OPEN_TOOL]

    # -- recall ------------------------------------------------------------------------------

    def prefetch(self, query: str, *, session_id: str = "") -> str:
        """The best few earlier messages for the user's ``query``, with what the last
        ``queue_prefetch`` found; "" when there are none or SGME cannot answer in time."""
        session = session_id or self._session_id
        with self._lock:
            queued, self._queued = self._queued, None
        hits = self._recall(query, session, PREFETCH_TIMEOUT)
        if queued is not None and queued[0] == session:
            keep = self._keeper(session)
            hits += [hit for hit in queued[1] if keep(hit)]
        unique: dict[str, dict[str, Any]] = {}
        for hit in hits:
            unique.setdefault(hit["source_ref"], hit)
        return recall.render(list(unique.values())[:PREFETCH_HITS])

    def queue_prefetch(self, query: str, *, session_id: str = "") -> None:
        """Recall for the next turn the words of the one that just ended (Hermes runs this on
        its background worker, after ``sync_turn``); the next ``prefetch`` shows it."""
        session = session_id or self._session_id
        hits = self._recall(query, session, BACKGROUND_TIMEOUT)
        with self._lock:
            self._queued = (session, hits)

    def _recall(self, query: str, session: str, timeout: float) -> list[dict[str, Any]]:
        """What :meth:`recall.Reader.recall` finds for ``query`` within ``timeout`` seconds,
        without the session's latest turns; [] when SGME does not answer (said once)."""
        if self._reader is None or not query.strip():
            return []
        try:
            hits = self._reader.recall(
                query,
                limit=PREFETCH_HITS,
                deadline=time.monotonic() + timeout,
                keep=self._keeper(session),
            )
        except recall.Unavailable as exc:
            if not self._recall_failing:
                logger.warning("sgme: recall skipped: %s", exc)
                self._recall_failing = True
            return []
        self._recall_failing = False
        return hits

    def _keeper(self, session: str) -> Callable[[dict[str, Any]], bool]:
        """Whether recall should show a hit: not when it is one of ``session``'s latest turns."""
        with self._lock:
            starts = self._recent.get(session)
            since = min(starts) if starts else None

        def keep(hit: dict[str, Any]) -> bool:
            if since is None or hit.get("session_key") != session:
                return True
            when = recall.parse_ts(hit.get("ts"))
            return when is None or when < since

        return keep

    def _remember_turn(self, session: str, messages: list[dict[str, Any]]) -> None:
        """Note when a synced turn began (its earliest message)."""
        times = [t for t in (recall.parse_ts(m.get("ts")) for m in messages) if t is not None]
        if not times:
            return
        with self._lock:
            starts = self._recent.pop(session, None) or deque(maxlen=RECENT_TURNS)
            starts.append(min(times))
            self._recent[session] = starts
            while len(self._recent) > RECENT_SESSIONS:
                self._recent.popitem(last=False)

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        """``sgme_search`` and ``sgme_open``; a JSON object, ``{"error": …}`` when it failed."""
        if self._reader is None:
            return json.dumps({"error": "the sgme provider is not initialized"})
        args = args if isinstance(args, dict) else {}
        try:
            if tool_name == recall.SEARCH_TOOL["name"]:
                answer = recall.search_tool(self._reader, args)
            elif tool_name == recall.OPEN_TOOL["name"]:
                answer = recall.open_tool(self._reader, args)
            else:
                answer = {"error": f"the sgme provider has no tool {tool_name!r}"}
        except recall.Unavailable as exc:
            answer = {"error": str(exc)}
        return json.dumps(answer, ensure_ascii=False)

    def sync_turn(
        self,
        user_content: str,
        assistant_content: str,
        *,
        session_id: str = "",
        messages: list[dict[str, Any]] | None = None,
    ) -> None:
        if not self._writes or self._sender is None:
            return
        session = session_id or self._session_id
        if not session:
            return
        completed = convention.ts(time.time())
        found = None
        if messages:
            found = turns.current_turn(messages, assistant_content or "", when=completed)
        if found is None:
            # no transcript (an older Hermes): this turn alone, numbered by this process
            only = [
                {"role": "user", "content": user_content},
                {"role": "assistant", "content": assistant_content},
            ]
            converted, _ = chat.convert(only, when=completed)
            found = (self._turns + 1, converted)
        number, turn = found
        self._turns = number
        if not turn:
            return
        key, bodies = turns.bodies(
            session, number, turn, agent_id=self._config["agent_id"], metadata=self._metadata
        )
        branch = self._branch(session)
        new = key not in self._sent  # else the same turn again: it is already on its way
        places = branch.rewound(number) if session in self._rewound else []
        out = bodies if new else []
        if places:
            marker = turns.rewind_body(
                session,
                number,
                turn,
                places,
                agent_id=self._config["agent_id"],
                metadata=self._metadata,
                when=completed,
            )
            out = [marker, *out]
        if not out:
            return
        if new:
            self._remember_turn(session, turn)
        if self._sender.put(out):
            # only what is spooled or held is on its way; what is not stays unsent, so a
            # later sync of the turn tries it (and the rewind marker) again
            self._rewound.discard(session)
            if places:
                branch.rewind(number)
            if new:
                branch.add(number, turn)
                self._sent[key] = None
                while len(self._sent) > REMEMBERED_KEYS:
                    self._sent.popitem(last=False)
        self._sender.kick()

    def _branch(self, session: str) -> chat.Branch:
        """The turns this process stored for ``session`` (the latest sessions only)."""
        branch = self._branches.pop(session, None) or chat.Branch()
        self._branches[session] = branch
        while len(self._branches) > RECENT_SESSIONS:
            self._branches.popitem(last=False)
        return branch

    def on_session_end(self, messages: list[dict[str, Any]]) -> None:
        if self._sender is not None:
            self._sender.deliver(deadline=time.monotonic() + DRAIN_TIMEOUT)

    def on_session_switch(
        self,
        new_session_id: str,
        *,
        parent_session_id: str = "",
        reset: bool = False,
        rewound: bool = False,
        **kwargs: Any,
    ) -> None:
        # Spooled turns carry their own session_key: switching drops nothing queued.
        if rewound and new_session_id:
            # /undo: the next turn says how far back (its number); a marker goes before it
            self._rewound.add(new_session_id)
        if kwargs.get("reason") == "compression" and new_session_id:
            # compacted (in place, the same id): the live turns are numbered anew, and a rewind
            # can no longer take back what was stored before
            self._branches.pop(new_session_id, None)
        if new_session_id and new_session_id != self._session_id:
            self._session_id = new_session_id
            self._turns = 0
        if parent_session_id:
            self._metadata["parent_session"] = parent_session_id
        else:
            self._metadata.pop("parent_session", None)

    def shutdown(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def get_config_schema(self) -> list[dict[str, Any]]:
        return [
            {
                "key": "url",
                "description": "SGME L0 server URL",
                "default": DEFAULT_URL,
                "env_var": "SGME_URL",
            },
            {
                "key": "token",
                "description": "SGME bearer token (sgme token create)",
                "secret": True,
                "env_var": "SGME_TOKEN",
            },
            {
                "key": "agent_id",
                "description": "agent_id the turns are stored under",
                "default": DEFAULT_AGENT_ID,
                "env_var": "SGME_AGENT_ID",
            },
        ]

    def save_config(self, values: dict[str, Any], hermes_home: str) -> None:
        keep = {k: str(v) for k, v in values.items() if k in ("url", "agent_id") and v}
        path = Path(hermes_home) / CONFIG_FILE
        path.write_text(json.dumps(keep, indent=2) + "\n", encoding="utf-8")


def register(ctx: Any) -> None:
    """Hermes' plugin entry point."""
    ctx.register_memory_provider(SgmeMemoryProvider())
