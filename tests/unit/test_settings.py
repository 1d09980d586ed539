"""Settings (:mod:`pipeline.settings`): every option defined once, read from YAML, the
environment and overrides in that order, and refused with its name when it is not of its type
or out of its range."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline import errors, search, sessions, settings
from pipeline.settings import Limits, Settings

ROOT = Path(__file__).resolve().parents[2]


def test_default_yaml_documents_exactly_the_built_in_defaults() -> None:
    assert Settings.load(ROOT / "config" / "default.yaml", environ={}) == Settings()


def test_precedence_is_defaults_then_file_then_environment_then_overrides(tmp_path: Path) -> None:
    config = tmp_path / "sgme.yaml"
    config.write_text("port: 9000\nrefine_min_messages: 3\nlimits: {max_session_key: 40}\n")
    env = {"SGME_PORT": "9100"}
    loaded = Settings.load(config, environ=env)
    assert (loaded.port, loaded.refine.min_messages, loaded.limits.max_session_key) == (
        9100,
        3,
        40,
    )
    assert Settings.load(config, environ=env, port=9200).port == 9200
    assert Settings.load(config, environ=env, port=None).port == 9100  # None: not given


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("SGME_REQUIRE_AUTH", "ture", "not a boolean"),
        ("SGME_FILE_LOCKS", "", "not a boolean"),
        ("SGME_PORT", "80a", "bad value"),
        ("SGME_PORT", "70000", "1-65535"),
        ("SGME_REFINE_MIN_MESSAGES", "2.5", "not a whole number"),
        ("SGME_SWEEP_AGE", "nan", "not a finite number"),
        ("SGME_SWEEP_AGE", "-1", "must not be negative"),
        ("SGME_LIMITS_MAX_SESSION_KEY", "-5", "must not be negative"),
        ("SGME_ORDER_WAIT_SECONDS", "9999999999", "order_wait_seconds"),
        ("SGME_TOKEN_CACHE_SECONDS", "61", "token_cache_seconds"),
        ("SGME_SQLITE_SYNCHRONOUS", "NORMAL", "power cut"),
        ("SGME_REFINER_OPTIONS", "[1, 2]", "not a mapping"),
        ("SGME_MCP_MAX_SESSIONS", "201", "between 1 and 200"),
        ("SGME_MCP_PAGE_CHARS", "0", "at least 1"),
        ("SGME_UI_PAGE_SESSIONS", "0", "between 1 and 200"),
        ("SGME_UI_PAGE_HITS", "101", "between 1 and 100"),
        ("SGME_UI_LOGIN_SECONDS", "0", "at least 1"),
        ("SGME_EMBED_RERANK", "199", "at least search_candidates (200)"),
        ("SGME_EMBED_EXACT_BELOW", "-1", "must not be negative"),
    ],
)
def test_a_bad_value_is_refused_with_the_setting_s_name(key: str, value: str, needle: str) -> None:
    with pytest.raises(errors.InvalidInput) as info:
        Settings.load(environ={key: value})
    name = key.removeprefix("SGME_").lower()
    assert name in info.value.detail and needle in info.value.detail, info.value.detail


def test_a_shortlist_may_always_apply() -> None:
    embed = Settings.load(environ={"SGME_EMBED_EXACT_BELOW": "0", "SGME_EMBED_RERANK": "200"}).embed
    assert (embed.exact_below, embed.rerank) == (0, 200)


def test_booleans_take_the_usual_spellings() -> None:
    for text, expected in (
        ("true", True),
        ("Yes", True),
        ("1", True),
        ("off", False),
        ("NO", False),
    ):
        assert Settings.load(environ={"SGME_REQUIRE_AUTH": text}).require_auth is expected


def test_a_yaml_value_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "sgme.yaml"
    config.write_text("host: [a, b]\n")
    with pytest.raises(errors.InvalidInput, match="setting host"):
        Settings.load(config, environ={})


def test_unknown_settings_are_named() -> None:
    with pytest.raises(errors.InvalidInput, match="unknown settings: refine_typo"):
        Settings.load(environ={}, refine_typo=1)


def test_limits_are_settings() -> None:
    loaded = Settings.load(
        environ={
            "SGME_HTTP_MAX_REQUEST_BYTES": "123",
            "SGME_BACKLOG_MAX_FILE_MESSAGES": "7",
            "SGME_LIMITS_MAX_METADATA_DEPTH": "4",
        }
    )
    assert loaded.http.max_request_bytes == 123
    assert loaded.backlog.max_file_messages == 7
    assert loaded.limits == Limits(max_metadata_depth=4)


def test_auth_settings_come_from_yaml_and_the_environment(tmp_path: Path) -> None:
    env = {
        "SGME_ALLOWED_HOSTS": "api, sgme.example.org ,",
        "SGME_REQUIRE_AUTH": "true",
        "SGME_TOKEN_CACHE_SECONDS": "2.5",
        "SGME_REFINE_COOLDOWN_SECONDS": "30",
    }
    s = Settings.load(environ=env)
    assert s.allowed_hosts == ("api", "sgme.example.org")
    assert (s.require_auth, s.token_cache_seconds) == (True, 2.5)
    assert s.refine.cooldown_seconds == 30
    config = tmp_path / "sgme.yaml"
    config.write_text("allowed_hosts: [a, '::1']\nmetrics_require_auth: yes\n", encoding="utf-8")
    s = Settings.load(config, environ={})
    assert s.allowed_hosts == ("a", "::1") and s.metrics_require_auth is True


def test_file_locks_can_be_left_out_only_with_postgresql() -> None:
    with pytest.raises(errors.InvalidInput, match="file_locks: false needs PostgreSQL"):
        Settings.load(environ={"SGME_FILE_LOCKS": "false"})
    loaded = Settings.load(
        environ={"SGME_FILE_LOCKS": "false", "SGME_DATABASE_URL": "postgresql://db/sgme"}
    )
    assert loaded.file_locks is False
    assert Settings.load(environ={}).file_locks is True


def test_the_mcp_and_view_bounds_are_settings_within_what_their_routes_take() -> None:
    loaded = Settings.load(
        environ={"SGME_MCP_MAX_SEARCH_HITS": "7", "SGME_UI_PAGE_MESSAGES": "25"},
        ui_max_form_bytes=1024,
    )
    assert (loaded.mcp.max_search_hits, loaded.ui.page_messages) == (7, 25)
    assert loaded.ui.max_form_bytes == 1024
    # the bounds the settings are checked against are the code's own
    assert settings.AT_MOST["mcp_max_search_hits"] == search.MAX_LIMIT
    assert settings.AT_MOST["ui_page_hits"] == search.MAX_LIMIT
    assert settings.AT_MOST["mcp_max_sessions"] == sessions.MAX_LIMIT
    assert settings.AT_MOST["ui_page_sessions"] == sessions.MAX_LIMIT


#: the settings that bound what a client, a page or a tool may cost: docs/operations.md names
#: each one in its table of limits (what it bounds, what a client gets at it)
BOUNDS = ("http_", "limits_", "backlog_", "mcp_", "ui_", "search_")


def test_operations_md_names_every_bound_with_its_setting() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    every = settings.keys()  # a function of the module, not a mapping's keys
    named = [k for k in every if k.startswith(BOUNDS)]
    named += ["order_wait_seconds", "token_cache_seconds", "broker_claim_interval"]
    assert [k for k in named if f"`{k}`" not in text] == []


def test_a_searchs_defaults_are_the_search_settings_own() -> None:
    """One home for each number: a library call's search (no time bound) and a request's
    (the settings) rank with the same candidates, bounds and weights."""
    made = Settings.load(environ={}, search_candidates=50, search_context_weight=0.5).search
    assert search.Ranking.of(made) == search.Ranking(
        timeout=5.0, candidates=50, common_matches=5_000, context_weight=0.5, context_chars=1_000
    )
    assert search.Ranking.of(Settings().search) == dataclasses.replace(
        search.Ranking(), timeout=Settings().search.timeout
    )
