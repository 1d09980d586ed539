"""The secret rule set (pipeline.redactor): every kind found in its usual surroundings and
replaced by its marker, nothing else touched — hashes, ids, blobs and code come back as sent —
and redacting twice the same as once."""

from __future__ import annotations

import json
import random

import pytest
import secret_samples
from hypothesis import example, given
from hypothesis import strategies as st

from pipeline import redactor


@pytest.mark.parametrize("kind", sorted(secret_samples.MAKERS))
def test_every_kind_is_found_in_its_surroundings_and_only_it_is_replaced(kind: str) -> None:
    rng = random.Random(kind)
    for _ in range(25):
        text, secret = secret_samples.message(kind, rng)
        if secret not in text:  # written inside a JSON string: escaped
            secret = json.dumps(secret)[1:-1]
        assert secret in text
        done = redactor.redact(text)
        assert secret not in done.text, (kind, text, done.text)
        assert done.count >= 1
        assert redactor.marker(kind) in done.text or kind in ("aws-access-key",), done.text
        # what surrounds the secret is kept
        left = text.split(secret)[0]
        assert done.text.startswith(left[: max(0, len(left) - 60)])


def test_each_kind_is_named_in_its_marker() -> None:
    rng = random.Random(7)
    for kind in secret_samples.MAKERS:
        value = secret_samples.MAKERS[kind](rng)
        if kind in secret_samples.CONTEXTS:
            continue  # found by where it stands: the context tests cover it
        assert redactor.redact(f"value: `{value}`").text == f"value: `{redactor.marker(kind)}`"


@pytest.mark.parametrize("seed", range(30))
def test_look_alikes_survive_untouched(seed: int) -> None:
    for text in secret_samples.look_alikes(random.Random(seed)):
        assert redactor.scan(text) == [], text


@pytest.mark.parametrize(
    "text",
    [
        "def token_count(tokens: list[str]) -> int:\n    return len(tokens)",
        "password = input('Password: ')",
        "secret_name = 'prod/db'\ntoken_type = 'bearer'",
        "api_key: str | None = None",
        "if not password:\n    raise ValueError('password required')",
        "SECRET_KEY = os.environ['SECRET_KEY']",
        "export GITHUB_TOKEN=$(gh auth token)",
        "password: <your-password>",
        "Set OPENAI_API_KEY=your_api_key_here in .env",
        "pk_live_51HqLyjWDarjtT1zdp7dcXzMorS (publishable: not a secret)",
        "The word 'password' alone, and password123 in prose.",
        "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 ada@laptop",
        "https://user@example.com/path and https://example.com:8443/x",
        "uuid 3fa85f64-5717-4562-b3fc-2c963f66afa6 and id 0b7e4f3a9c2d",
        "eyJhbGciOiJIUzI1NiJ9 alone is only a header",
    ],
)
def test_code_and_prose_about_secrets_is_not_a_secret(text: str) -> None:
    assert redactor.scan(text) == [], redactor.redact(text).text


def test_a_redacted_text_redacted_again_is_the_same() -> None:
    rng = random.Random(3)
    for kind in secret_samples.MAKERS:
        once = redactor.redact(secret_samples.message(kind, rng)[0])
        twice = redactor.redact(once.text)
        assert twice.text == once.text and twice.count == 0


@given(st.text(max_size=300))
def test_arbitrary_text_redacts_without_error_and_markers_are_stable(text: str) -> None:
    done = redactor.redact(text)
    assert redactor.redact(done.text).text == done.text
    if done.count == 0:
        assert done.text == text


def test_a_key_in_the_middle_of_a_long_tool_output() -> None:
    rng = random.Random(11)
    key = secret_samples.MAKERS["github-token"](rng)
    filler = "\n".join(f"line {i}: " + "x" * 70 for i in range(20_000))
    done = redactor.redact(filler + "\n" + key + "\n" + filler)
    assert done.count == 1 and key not in done.text
    assert len(done.text) == 2 * len(filler) + 2 + len(redactor.marker("github-token"))


def _every_rule(text: str) -> list[redactor.Finding]:
    """:func:`redactor.scan` without its shortcuts: every rule's regex and the assignments'
    run on every text, whatever it holds."""
    candidates = [f for rule in redactor._RULES for f in redactor._found(rule, text)]
    return redactor._kept(text, [*candidates, *redactor._assignments(text)])


#: pieces the shortcuts look for (the needles, the names' words, signs), in both cases
_PIECES = st.sampled_from(
    [
        *("AKIA", "ASIA", "A3T", "ghp_", "github_pat_", "glpat-", "sk-", "eyJ", "://", "@"),
        *("pass", "PassWord", "pwd", "SECRET", "token", "Credentials", "key", "api_key"),
        *("=", ":", "-", "--", " ", "\n", '"', "'", "ſ", "K", "İ", "é"),
        *("x" * 20, "A" * 16, "0123456789abcdefABCDEF", "Bearer ", "authorization"),
        *("--password ", "-p", "---", "--api-key=", "db_password: ", "hunter2", "s3cr3t!x"),
    ]
)


@given(st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=40).map("".join))
# each prefix of a rule with several needles alone (with another, the rule runs anyway)
@example("A3TQ" + "B" * 16)
@example("ABIA" + "B" * 16)
@example("ghr_" + "b" * 36)
@example("github_pat_" + "c" * 82)
@example("run it --- with --db-password=Xk2p9Qm7Lr and -token 'Zq8Wn3Vb6Ty'")
def test_the_shortcuts_find_what_every_rule_finds(text: str) -> None:
    """A rule's regex runs only when one of its needles is in the text, and the assignments
    only when an ASCII text holds a word of a secret's name: they find what running them all
    finds."""
    assert redactor.scan(text) == _every_rule(text)


@pytest.mark.parametrize("kind", sorted(secret_samples.MAKERS))
def test_the_shortcuts_find_every_sample(kind: str) -> None:
    rng = random.Random(f"shortcuts-{kind}")
    for _ in range(10):
        text, _ = secret_samples.message(kind, rng)
        assert redactor.scan(text) == _every_rule(text)
