"""The web view in a real browser: Debian's headless Chromium (``apt-get install chromium``;
nothing is downloaded at run time) driven by Playwright, against a running ``sgme serve`` with
tokens. A person's path — log in, list, open a session, follow an L1 item to its message,
search, open a hit — a message full of HTML and script shown as text, and the token cookie.

Screenshots of each page are saved for a person to look at: in ``$SGME_UI_SCREENSHOTS`` when
it is set, else in the test's temporary directory (``screens/``)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest
from conftest import unavailable

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE = (
    'Look: <script>window.__pwned = 1</script> and <img src=x onerror="window.__pwned = 2">\n\n'
    '<a href="javascript:window.__pwned=3">click</a> [md link](javascript:window.__pwned=4)\n\n'
    "<b>not bold</b> **bold**"
)


@dataclasses.dataclass(frozen=True)
class Site:
    url: str
    reader: str  #: a read token for agent alpha
    appender: str  #: an append-only token (no read)
    session: str  #: alpha's session file
    other: str  #: beta's session file
    screens: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        unavailable(f"{CHROMIUM} is missing: apt-get install chromium (make browser does)")
    root = tmp_path_factory.mktemp("ui")
    screens = Path(os.environ.get("SGME_UI_SCREENSHOTS") or root / "screens")
    shutil.rmtree(screens, ignore_errors=True)
    screens.mkdir(parents=True)
    data_dir = root / "data"
    procs = harness.Procs(root / "logs")
    env = harness.clean_env(**harness.FAST)
    try:
        procs.run(["migrate", "--data-dir", str(data_dir)], env)

        def token(agent: str, scope: str) -> str:
            argv = ["token", "create", "--data-dir", str(data_dir), "--agent-id", agent]
            return procs.run([*argv, "--scope", scope], env).strip().splitlines()[-1]

        admin, reader, appender = (
            token("*", "admin"),
            token("alpha", "read"),
            token("alpha", "append"),
        )
        port = harness.free_port()
        argv = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"]
        proc = procs.start("serve", argv, env)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(
            base_url=url, timeout=10.0, headers={"Authorization": f"Bearer {admin}"}
        ) as client:
            harness.wait_healthy(client, proc, timeout=60)

            def append(agent: str, key: str, messages: list[dict[str, Any]]) -> str:
                body = {"agent_id": agent, "session_key": key, "messages": messages}
                r = client.post("/v1/append", params={"wait": "flushed"}, json=body)
                assert r.status_code == 200, r.text
                return str(r.json()["file_id"])

            session = append(
                "alpha",
                "kitchen-42",
                [
                    {"role": "user", "content": "Plan the kitchen renovation with me."},
                    {
                        "role": "assistant",
                        "content": '**tool call**: read_file\n\n{"path": "plan.md"}',
                    },
                    {
                        "role": "tool",
                        "tool_name": "read_file",
                        "content": "walls: white\nfloor: oak",
                    },
                    {"role": "user", "content": "I prefer oak floors over tiles in the kitchen."},
                    {"role": "assistant", "content": HOSTILE},
                    {"role": "assistant", "content": "Then oak it is: ```\nfloor = 'oak'\n```"},
                ],
            )
            other = append("beta", "secret", [{"role": "user", "content": "beta's oak secret"}])

            def refined() -> bool:
                items = client.get("/v1/l1", params={"file_id": session}).json()["items"]
                return any(i["kind"] == "preference" for i in items)

            harness.wait_until(
                refined, timeout=60, what="the session refined", check=proc.check_alive
            )
        yield Site(url, reader, appender, session, other, screens)
    finally:
        procs.close()


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.errors = errors
    try:
        yield page
    finally:
        context.close()


def login(page: Any, site: Site, token: str) -> None:
    page.goto(f"{site.url}/ui")
    assert page.url.startswith(f"{site.url}/ui/login?next=%2Fui")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_load_state()  # the new page parsed before it is read


def test_a_person_browses_follows_an_item_and_searches(page: Any, site: Site) -> None:
    login(page, site, site.reader)
    assert page.url == f"{site.url}/ui"
    assert page.inner_text("#count") == "1–1 of 1 sessions"  # beta's session is not listed
    row = page.locator("table.sessions tbody tr")
    assert row.count() == 1
    assert "Plan the kitchen renovation with me." in row.inner_text()
    assert "kitchen-42" in row.inner_text() and "alpha" in row.inner_text()
    page.screenshot(path=str(site.screens / "1-sessions.png"), full_page=True)

    page.click("td.title a")
    page.wait_for_load_state()  # the new page parsed before it is read
    assert page.url == f"{site.url}/ui/files/{site.session}"
    assert page.locator("article.message").count() == 6
    call = page.locator("#seq-2")
    assert "tool call · read_file" in call.inner_text()
    assert not call.locator("details").evaluate("d => d.open")  # folded
    assert not page.locator("#seq-3 pre").is_visible()  # the result, folded too
    page.locator("#seq-3 summary").click()
    assert page.locator("#seq-3 pre").inner_text() == "walls: white\nfloor: oak"
    page.screenshot(path=str(site.screens / "2-session.png"), full_page=True)

    item = page.locator(".l1 .item", has_text="oak floors")
    assert item.count() == 1
    item.locator("a.source").first.click()
    page.wait_for_load_state()  # the new page parsed before it is read
    assert page.url.endswith("#seq-4")
    assert page.locator("article:target").get_attribute("id") == "seq-4"
    assert "I prefer oak floors" in page.locator("article:target").inner_text()

    page.fill("header .quick input[name=q]", "tiles")
    page.press("header .quick input[name=q]", "Enter")
    page.wait_for_load_state()  # the new page parsed before it is read
    assert page.url == f"{site.url}/ui/search?q=tiles"
    hits = page.locator("li.hit")
    # the message that has the word first, then the two turns after it, which do not say it
    # but hold it in their context terms (the turns before them, docs/search.md)
    assert hits.count() == 3
    assert "oak floors over tiles" in hits.first.locator(".snippet").inner_text()
    assert all("tiles" not in hits.nth(n).locator(".snippet").inner_text() for n in (1, 2))
    # in context: the messages around it
    assert "walls: white" in hits.first.locator(".context").first.inner_text()
    page.screenshot(path=str(site.screens / "3-search.png"), full_page=True)
    hits.first.locator("a.open").click()
    page.wait_for_load_state()  # the new page parsed before it is read
    assert page.url == f"{site.url}/ui/files/{site.session}#seq-4"
    assert page.locator("article:target").get_attribute("id") == "seq-4"
    assert page.errors == []


def test_message_html_and_script_render_as_text(page: Any, site: Site) -> None:
    login(page, site, site.reader)
    response = page.goto(f"{site.url}/ui/files/{site.session}#seq-5")
    assert "script-src" not in response.headers["content-security-policy"]
    assert "default-src 'none'" in response.headers["content-security-policy"]
    body = page.locator("#seq-5 .body")
    text = body.inner_text()
    assert "<script>window.__pwned = 1</script>" in text
    assert '<img src=x onerror="window.__pwned = 2">' in text
    assert "<b>not bold</b>" in text
    assert body.locator("strong").inner_text() == "bold"  # Markdown still renders
    assert page.locator("script").count() == 0
    assert body.locator("img, b, a[href^='javascript']").count() == 0
    for link in body.locator("a").all():
        link.click()
    assert page.evaluate("window.__pwned") is None
    page.screenshot(path=str(site.screens / "4-hostile-message.png"), full_page=True)


def test_token_flow(page: Any, site: Site) -> None:
    page.goto(f"{site.url}/ui/files/{site.session}")
    assert "/ui/login?next=" in page.url
    page.fill("input[name=token]", "sgme_" + "x" * 43)
    page.click("button[type=submit]")
    page.wait_for_load_state()  # the new page parsed before it is read
    assert page.locator("p.error").inner_text() == "unknown, revoked or malformed token"
    page.fill("input[name=token]", site.appender)
    page.click("button[type=submit]")
    page.wait_for_load_state()  # the new page parsed before it is read
    assert "lacks the read scope" in page.locator("p.error").inner_text()
    page.screenshot(path=str(site.screens / "5-login-refused.png"), full_page=True)
    page.fill("input[name=token]", site.reader)
    page.click("button[type=submit]")
    page.wait_for_load_state()  # the new page parsed before it is read
    assert page.url == f"{site.url}/ui/files/{site.session}"  # back where it was asked from
    (cookie,) = page.context.cookies()
    assert (cookie["name"], cookie["value"]) == ("sgme_token", site.reader)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert page.evaluate("document.cookie") == ""  # scripts never see it
    # another agent's session is as absent as one that does not exist
    other = page.goto(f"{site.url}/ui/files/{site.other}")
    assert other.status == 404
    missing = page.goto(f"{site.url}/ui/files/00000000-0000-4000-8000-000000000000")
    assert missing.status == 404
    assert page.inner_text("p.error") == "no file 00000000-0000-4000-8000-000000000000"
    page.goto(f"{site.url}/ui")
    page.click("header form.out button")
    page.wait_for_load_state()  # the new page parsed before it is read
    assert page.url == f"{site.url}/ui/login"
    assert page.context.cookies() == []

    # the login form is the only write, and a page of another site cannot post it
    form = {"token": site.reader, "next": "/ui"}
    with httpx.Client(base_url=site.url) as client:
        hostile = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        r = client.post("/ui/login", data=form, headers=hostile)
        assert r.status_code == 403 and "set-cookie" not in r.headers
        r = client.post(
            "/ui/login", content=f"token={site.reader}", headers={"Content-Type": "text/plain"}
        )
        assert r.status_code == 415 and "set-cookie" not in r.headers
        r = client.post("/ui/login", data=form, headers={"Origin": site.url})
        assert r.status_code == 303 and r.headers["location"] == "/ui"
        assert (
            "HttpOnly" in r.headers["set-cookie"] and "SameSite=strict" in r.headers["set-cookie"]
        )
