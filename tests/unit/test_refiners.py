"""The refiners (docs/design.md §4): the built-in offline extractor, the OpenAI-compatible
chat-completions refiner and the webhook, each against a local HTTP server; loading them by
entry point; and the check every refiner's items pass before they are stored."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import factories
import pytest

from pipeline import document, errors, refine, tables
from pipeline.refiners import openai as openai_refiner
from pipeline.refiners.builtin import MAX_ITEM_CHARS, BuiltinRefiner
from pipeline.refiners.openai import OpenAIRefiner
from pipeline.refiners.webhook import WebhookRefiner

FILE_ID = "0c4f2d6e-9a1b-4c3d-8e5f-6a7b8c9d0e1f"
TS = "2026-08-03T11:18:06Z"


def file_row() -> tables.FileRow:
    return factories.file_row(FILE_ID)


def ref(seq: int) -> str:
    return f"{FILE_ID}:{seq}"


def window(*messages: tuple[str, str] | tuple[str, str, str], first: int = 1) -> refine.Window:
    """One window holding ``(role, content[, tool_name])`` messages from seq ``first`` on."""
    msgs = []
    for i, (role, content, *tool) in enumerate(messages):
        msgs.append(document.Message(role, content, TS, tool[0] if tool else None, first + i))
    [w] = refine.windows(file_row(), msgs, budget_tokens=100_000)
    return w


def found(items: list[refine.Item]) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(i.kind, i.content, i.source_refs) for i in items]


# ---------------------------------------------------------------------------------------------
# builtin


def test_builtin_extracts_english_statements_users_make_about_themselves() -> None:
    w = window(
        ("user", "I prefer tea over coffee. The weather is nice today."),
        ("user", "My name is Alice and I work at Acme. Thanks!"),
        ("user", "I'm a data engineer.\nI live in Berlin."),
        ("user", "I don't like long meetings!"),
        ("user", "What time is it?"),
    )
    assert found(BuiltinRefiner().refine(w)) == [
        ("preference", "I prefer tea over coffee.", (ref(1),)),
        ("profile", "My name is Alice and I work at Acme.", (ref(2),)),
        ("profile", "I'm a data engineer.", (ref(3),)),
        ("profile", "I live in Berlin.", (ref(3),)),
        ("preference", "I don't like long meetings!", (ref(4),)),
    ]


def test_builtin_profile_needs_a_whole_word_after_i_am() -> None:
    w = window(
        ("user", "I'm afraid that won't work."),
        ("user", "I'm always late. I am also curious. I'm there in five."),
        ("user", "I'm an SRE. I am 34 years old. I'm based in Oslo."),
    )
    assert found(BuiltinRefiner().refine(w)) == [
        ("profile", "I'm an SRE.", (ref(3),)),
        ("profile", "I am 34 years old.", (ref(3),)),
        ("profile", "I'm based in Oslo.", (ref(3),)),
    ]


def test_builtin_extracts_chinese_statements() -> None:
    w = window(
        ("user", "我喜欢喝茶。今天天气不错。"),
        ("user", "我叫小明！我住在上海。"),
        ("user", "我在腾讯工作"),
        ("user", "我们决定用 PostgreSQL。"),
        ("assistant", "好的，就用 Redis 做缓存。"),
        ("user", "今天是星期几？"),
    )
    assert found(BuiltinRefiner().refine(w)) == [
        ("preference", "我喜欢喝茶。", (ref(1),)),
        ("profile", "我叫小明！", (ref(2),)),
        ("profile", "我住在上海。", (ref(2),)),
        ("profile", "我在腾讯工作", (ref(3),)),
        ("decision", "我们决定用 PostgreSQL。", (ref(4),)),
        ("decision", "好的，就用 Redis 做缓存。", (ref(5),)),
    ]


def test_builtin_takes_decisions_from_anyone_but_the_user_profile_only_from_users() -> None:
    w = window(
        ("assistant", "We decided to use PostgreSQL for the index. I prefer short answers."),
        ("system", "Decision: all times are UTC."),
        ("assistant", "My name is Hermes. Let's go with option B."),
        ("user", "We'll use the staging cluster."),
    )
    assert found(BuiltinRefiner().refine(w)) == [
        ("decision", "We decided to use PostgreSQL for the index.", (ref(1),)),
        ("decision", "Decision: all times are UTC.", (ref(2),)),
        ("decision", "Let's go with option B.", (ref(3),)),
        ("decision", "We'll use the staging cluster.", (ref(4),)),
    ]


def test_builtin_summarises_tool_results_by_name_and_first_line() -> None:
    w = window(
        ("tool", "\n\n  total 12 files  \nfile_a\nfile_b", "ls"),
        ("tool", "```\nI prefer code\n```\nexit status 0", "bash"),
        ("tool", "```\nonly code\n```", "python"),
        ("tool", "", "noop"),
        ("tool", "I prefer tea.", "echo"),
        ("tool", '{"output":"On branch main\\n","metadata":{"exit_code":0}}', "shell"),
    )
    assert found(BuiltinRefiner().refine(w)) == [
        ("tool_result", "ls: total 12 files", (ref(1),)),
        ("tool_result", "bash: exit status 0", (ref(2),)),
        ("tool_result", "echo: I prefer tea.", (ref(5),)),
        ("tool_result", "shell: On branch main", (ref(6),)),  # Codex's JSON: its output
    ]


def test_builtin_skips_code_fences() -> None:
    w = window(
        ("user", "```python\n# I prefer tabs\nmy_name = 'x'  # my name is x\n```\nNothing here."),
        ("user", "~~~\nI love fenced text.\n~~~\nI love plain text."),
        ("assistant", "```\nWe decided to use X.\n```"),
    )
    assert found(BuiltinRefiner().refine(w)) == [("preference", "I love plain text.", (ref(2),))]


def test_builtin_clips_long_statements_and_collapses_whitespace() -> None:
    long = "I prefer " + " ".join(["verbose"] * 80) + "."
    w = window(("user", long), ("user", "I prefer   tabs\tand  spaces."))
    items = BuiltinRefiner().refine(w)
    assert [(i.kind, len(i.content)) for i in items] == [
        ("preference", MAX_ITEM_CHARS),
        ("preference", len("I prefer tabs and spaces.")),
    ]
    assert items[0].content == long[: MAX_ITEM_CHARS - 1] + "…"
    assert items[1].content == "I prefer tabs and spaces."


def test_builtin_gives_one_item_per_statement_and_window() -> None:
    w = window(("user", "I prefer tea."), ("user", "I prefer tea."), ("user", "I prefer tea."))
    # The same statement again in the window is not a new item.
    assert found(BuiltinRefiner().refine(w)) == [("preference", "I prefer tea.", (ref(1),))]


def test_builtin_is_deterministic_and_refs_belong_to_the_window() -> None:
    w = window(
        ("user", "I prefer tea. My name is Bo. 我喜欢咖啡。"),
        ("assistant", "We agreed on Friday."),
        ("tool", "ok", "grep"),
        ("user", "I work at Initech."),
        first=41,
    )
    first = BuiltinRefiner().refine(w)
    assert BuiltinRefiner().refine(w) == first
    assert BuiltinRefiner().refine(w) == BuiltinRefiner().refine(w)
    assert len(first) == 6
    assert all(set(i.source_refs) <= set(w.source_refs) for i in first)
    assert {r for i in first for r in i.source_refs} == {ref(41), ref(42), ref(43), ref(44)}
    assert refine.check_items(w, first) == first


def test_builtin_refs_of_split_message_parts_are_the_message() -> None:
    content = "\n".join(f"I prefer option {i}." for i in range(400))
    msgs = [document.Message("user", content, TS, None, 3)]
    ws = refine.windows(file_row(), msgs, budget_tokens=200, overlap=1)
    assert len(ws) > 1
    items = [i for w in ws for i in BuiltinRefiner().refine(w)]
    assert sorted(i.content for i in items) == sorted(f"I prefer option {i}." for i in range(400))
    assert {i.source_refs for i in items} == {(ref(3),)}


def test_builtin_takes_no_options() -> None:
    with pytest.raises(errors.InvalidInput, match="takes no options; got model"):
        BuiltinRefiner(model="x")


# ---------------------------------------------------------------------------------------------
# a local HTTP server


Reply = tuple[int, bytes]


class Server:
    """A chat-completions / webhook stand-in: records each request, answers with ``reply``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.reply: Callable[[dict[str, Any]], Reply] = lambda _req: (200, b"{}")
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                request = {
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": json.loads(self.rfile.read(length)),
                }
                outer.requests.append(request)
                status, payload = outer.reply(request)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (the timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """Close the refiners' HTTP clients at the end (an unclosed socket warns, and warnings are
    errors here)."""
    made: list[Any] = []

    def keep(refiner: Any) -> Any:
        made.append(refiner)
        return refiner

    yield keep
    for refiner in made:
        refiner.client.close()


def completion(content: Any) -> Reply:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    return 200, json.dumps(body).encode()


TWO_MESSAGES = (("user", "I prefer tea."), ("assistant", "Noted."))
ANSWER = json.dumps(
    {"items": [{"kind": "decision", "content": "Use tea.", "source_refs": [f"{FILE_ID}:1"]}]}
)


# ---------------------------------------------------------------------------------------------
# openai


def test_openai_sends_the_window_and_its_refs_and_returns_the_items(
    server: Server, closing: Callable[[Any], Any]
) -> None:
    w = window(*TWO_MESSAGES, first=7)
    answer = {
        "items": [
            {"kind": "preference", "content": "The user prefers tea.", "source_refs": [ref(7)]},
            {"content": "Kindless item.", "source_refs": [ref(7), ref(8), 5]},
            {"kind": "fact", "content": 3, "source_refs": [ref(7)]},
            {"kind": "fact", "content": "no refs list", "source_refs": ref(7)},
            "not an object",
        ]
    }
    server.reply = lambda _req: completion(json.dumps(answer))
    refiner = closing(
        OpenAIRefiner(
            base_url=server.url + "/v1/", model="qwen2.5:7b", api_key="sk-test", timeout=5
        )
    )

    items = refiner.refine(w)

    assert found(items) == [
        ("preference", "The user prefers tea.", (ref(7),)),
        ("fact", "Kindless item.", (ref(7), ref(8))),
    ]
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer sk-test"
    assert request["body"] == {
        "model": "qwen2.5:7b",
        "temperature": 0.0,
        "messages": [
            {"role": "system", "content": openai_refiner.PROMPT},
            {"role": "user", "content": f"{w.text}\n---\nsource_refs:\n- {ref(7)}\n- {ref(8)}"},
        ],
        "response_format": {"type": "json_object"},
    }
    assert w.text.startswith("## 2026-08-03T11:18:06Z user\n\nI prefer tea.\n\n")


def test_openai_without_json_mode_or_key_sends_neither(
    server: Server, closing: Callable[[Any], Any]
) -> None:
    server.reply = lambda _req: completion('{"items": []}')
    refiner = closing(
        OpenAIRefiner(base_url=server.url, model="m", json_mode=False, temperature=0.5)
    )
    assert refiner.refine(window(*TWO_MESSAGES)) == []
    [request] = server.requests
    assert request["path"] == "/chat/completions"
    assert "authorization" not in request["headers"]
    assert "response_format" not in request["body"]
    assert request["body"]["temperature"] == 0.5


@pytest.mark.parametrize(
    "text",
    [
        "```json\n" + ANSWER + "\n```",
        "```\n" + ANSWER + "\n```",
        "  \n```json " + ANSWER + "```\n",
    ],
    ids=["json-fence", "bare-fence", "one-line-fence"],
)
def test_openai_accepts_an_answer_in_code_fences(
    server: Server, closing: Callable[[Any], Any], text: str
) -> None:
    server.reply = lambda _req: completion(text)
    refiner = closing(OpenAIRefiner(base_url=server.url, model="m", timeout=5))
    assert found(refiner.refine(window(*TWO_MESSAGES))) == [("decision", "Use tea.", (ref(1),))]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (completion("the user likes tea"), "not JSON"),
        (completion('{"items": [}'), "not JSON"),
        (completion('{"memories": []}'), "no 'items' list"),
        (completion('[{"kind": "fact"}]'), "no 'items' list"),
        (completion('{"items": {"kind": "fact"}}'), "no 'items' list"),
        (completion(None), "no text content"),
        ((500, b'{"error": "overloaded"}'), "answered 500"),
        ((429, b'{"error": "rate limited"}'), "answered 429"),
        ((201, completion('{"items": []}')[1]), "answered 201"),
        ((200, b'{"id": "x", "object": "chat.completion"}'), "not a chat-completions answer"),
        ((200, b'{"choices": []}'), "not a chat-completions answer"),
        ((200, b'{"choices": [{"text": "{}"}]}'), "not a chat-completions answer"),
        ((200, b"<html>bad gateway</html>"), "not a chat-completions answer"),
    ],
    ids=[
        "prose",
        "broken-json",
        "no-items",
        "list",
        "items-not-list",
        "null-content",
        "500",
        "429",
        "201",
        "no-choices",
        "empty-choices",
        "no-message",
        "html",
    ],
)
def test_openai_bad_answers_raise_refiner_error(
    server: Server, closing: Callable[[Any], Any], reply: Reply, message: str
) -> None:
    server.reply = lambda _req: reply
    refiner = closing(OpenAIRefiner(base_url=server.url, model="m", timeout=5))
    with pytest.raises(errors.RefinerError, match=message) as caught:
        refiner.refine(window(*TWO_MESSAGES))
    assert caught.value.retry is True
    assert len(server.requests) == 1


def test_openai_timeout_raises_refiner_error(server: Server, closing: Callable[[Any], Any]) -> None:
    def slow(_req: dict[str, Any]) -> Reply:
        server.release.wait(30)
        return completion('{"items": []}')

    server.reply = slow
    refiner = closing(OpenAIRefiner(base_url=server.url, model="m", timeout=0.3))
    started = time.monotonic()
    with pytest.raises(errors.RefinerError, match="request failed: ReadTimeout"):
        refiner.refine(window(*TWO_MESSAGES))
    assert time.monotonic() - started < 10  # the refiner's timeout, not the server's wait
    server.release.set()
    assert len(server.requests) == 1


def test_openai_unreachable_service_raises_refiner_error(closing: Callable[[Any], Any]) -> None:
    s = Server()
    url = s.url
    s.close()  # nothing listens on the port any more
    refiner = closing(OpenAIRefiner(base_url=url, model="m", timeout=2))
    with pytest.raises(errors.RefinerError, match="request failed: ConnectError"):
        refiner.refine(window(*TWO_MESSAGES))


# ---------------------------------------------------------------------------------------------
# webhook


def test_webhook_posts_the_window_and_returns_the_items(
    server: Server, closing: Callable[[Any], Any]
) -> None:
    w = window(("user", "I prefer tea."), ("tool", "3 rows", "sql"), first=2)
    server.reply = lambda _req: (
        200,
        json.dumps(
            {"items": [{"kind": "fact", "content": "Tea.", "source_refs": [ref(2), ref(3)]}]}
        ).encode(),
    )
    refiner = closing(
        WebhookRefiner(
            url=server.url + "/l1/ingest", timeout=5, headers={"Authorization": "Token abc"}
        )
    )

    assert found(refiner.refine(w)) == [("fact", "Tea.", (ref(2), ref(3)))]
    [request] = server.requests
    assert request["path"] == "/l1/ingest"
    assert request["headers"]["authorization"] == "Token abc"
    assert request["body"] == w.to_json()
    assert request["body"]["source_refs"] == [ref(2), ref(3)]
    assert request["body"]["messages"][1] == {
        "seq": 3,
        "ts": TS,
        "role": "tool",
        "content": "3 rows",
        "tool_name": "sql",
        "source_ref": ref(3),
    }


def test_webhook_accepts_any_2xx(server: Server, closing: Callable[[Any], Any]) -> None:
    server.reply = lambda _req: (202, b'{"items": []}')
    refiner = closing(WebhookRefiner(url=server.url))
    assert refiner.refine(window(*TWO_MESSAGES)) == []


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ((500, b'{"items": []}'), "answered 500"),
        ((404, b"not found"), "answered 404"),
        ((302, b'{"items": []}'), "answered 302"),
        ((200, b"ok"), "not JSON"),
        ((200, b'{"result": []}'), "no 'items' list"),
    ],
    ids=["500", "404", "302", "not-json", "no-items"],
)
def test_webhook_failures_raise_refiner_error(
    server: Server, closing: Callable[[Any], Any], reply: Reply, message: str
) -> None:
    server.reply = lambda _req: reply
    refiner = closing(WebhookRefiner(url=server.url, timeout=5))
    with pytest.raises(errors.RefinerError, match=message):
        refiner.refine(window(*TWO_MESSAGES))


def test_webhook_timeout_raises_refiner_error(
    server: Server, closing: Callable[[Any], Any]
) -> None:
    def slow(_req: dict[str, Any]) -> Reply:
        server.release.wait(30)
        return 200, b'{"items": []}'

    server.reply = slow
    refiner = closing(WebhookRefiner(url=server.url, timeout=0.3))
    with pytest.raises(errors.RefinerError, match="webhook request failed: ReadTimeout"):
        refiner.refine(window(*TWO_MESSAGES))
    server.release.set()


# ---------------------------------------------------------------------------------------------
# load_refiner


def test_load_refiner_by_entry_point_name(closing: Callable[[Any], Any]) -> None:
    builtin = refine.load_refiner("builtin")
    assert type(builtin) is BuiltinRefiner and builtin.name == "builtin"

    openai = closing(
        refine.load_refiner(
            "openai", {"base_url": "http://127.0.0.1:9/v1", "model": "m", "timeout": 1}
        )
    )
    assert type(openai) is OpenAIRefiner
    assert (openai.name, openai.url, openai.model) == (
        "openai",
        "http://127.0.0.1:9/v1/chat/completions",
        "m",
    )

    webhook = closing(refine.load_refiner("webhook", {"url": "http://127.0.0.1:9/hook"}))
    assert type(webhook) is WebhookRefiner
    assert (webhook.name, webhook.url) == ("webhook", "http://127.0.0.1:9/hook")


def test_load_refiner_by_module_and_class(closing: Callable[[Any], Any]) -> None:
    builtin = refine.load_refiner("pipeline.refiners.builtin:BuiltinRefiner")
    assert type(builtin) is BuiltinRefiner
    webhook = closing(
        refine.load_refiner("pipeline.refiners.webhook:WebhookRefiner", {"url": "http://x/"})
    )
    assert type(webhook) is WebhookRefiner


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("gpt", None, r"unknown refiner 'gpt'; installed: builtin, openai, webhook"),
        ("", None, "unknown refiner ''"),
        ("no_such_module_sgme:Refiner", None, "cannot load refiner"),
        ("pipeline.refiners.builtin:NoSuchClass", None, "cannot load refiner"),
        ("openai", {"model": "m"}, "bad options for refiner 'openai'"),
        ("webhook", {"url": "http://x/", "retries": 3}, "bad options for refiner 'webhook'"),
        ("builtin", {"model": "m"}, "the builtin refiner takes no options"),
    ],
)
def test_load_refiner_refuses_unknown_names_and_bad_options(
    name: str, options: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(errors.InvalidInput, match=message):
        refine.load_refiner(name, options)


# ---------------------------------------------------------------------------------------------
# check_items


def test_check_items_keeps_only_items_with_content_and_refs_from_the_window() -> None:
    w = window(("user", "a"), ("user", "b"), first=10)
    other = "ffffffff-ffff-4fff-bfff-ffffffffffff:10"
    items = [
        refine.Item("fact", "kept", (ref(10),)),
        refine.Item("fact", "outside", (other,)),
        refine.Item("fact", "seq outside", (ref(9), ref(12))),
        refine.Item("fact", "partly outside", (ref(12), ref(11), other, ref(11))),
        refine.Item("fact", "", (ref(10),)),
        refine.Item("fact", "  \n\t", (ref(10),)),
        refine.Item("fact", "no refs", ()),
        refine.Item("", "no kind", (ref(10),)),
        refine.Item("k" * 50, "long kind", (ref(11),)),
    ]
    assert found(refine.check_items(w, items)) == [
        ("fact", "kept", (ref(10),)),
        ("fact", "partly outside", (ref(11),)),
        ("fact", "no kind", (ref(10),)),
        ("k" * 40, "long kind", (ref(11),)),
    ]
    assert refine.check_items(w, []) == []


def test_item_digest_ignores_ref_order_but_not_kind_or_content() -> None:
    a = refine.Item("fact", "x", (ref(1), ref(2)))
    assert a.digest() == refine.Item("fact", "x", (ref(2), ref(1))).digest()
    assert a.digest() != refine.Item("decision", "x", (ref(1), ref(2))).digest()
    assert a.digest() != refine.Item("fact", "y", (ref(1), ref(2))).digest()
    assert a.digest() != refine.Item("fact", "x", (ref(1),)).digest()


def test_builtin_skips_calls_thinking_and_summaries_and_reads_a_result_s_output() -> None:
    from pipeline.importers import convention

    w = window(
        ("assistant", convention.call_body("note", '{"text": "We decided to use X."}', "c1")),
        ("assistant", "**thinking**\n\nWe decided to use X, I think."),
        ("system", "**compaction summary**\n\nWe decided to use X."),
        ("tool", convention.result_body("Saved the note.", "c1"), "note"),
        ("assistant", "We decided to use Y."),
    )
    assert found(BuiltinRefiner().refine(w)) == [
        ("tool_result", "note: Saved the note.", (ref(4),)),
        ("decision", "We decided to use Y.", (ref(5),)),
    ]
