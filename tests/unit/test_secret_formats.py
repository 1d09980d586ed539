"""The vendor formats, one test each (``pipeline/secret_formats.toml``): a value of the format's
form, made from its own pattern, is found whole by its rule and by the scan; the same value
masked (``xxxx…``) is not; and the table itself is sound (ids unique, keywords lower case,
every pattern compiles)."""

from __future__ import annotations

import base64
import random
import re
from collections.abc import Callable

import pytest
import secret_samples

from pipeline import redactor


#: formats whose check reads the value (a JWT's JSON header, a base64 PEM's first line): a
#: value made from the pattern alone would not pass it, so it is made as the real thing is
def _pem_base64(rng: random.Random) -> str:
    return base64.b64encode(secret_samples.MAKERS["private-key"](rng).encode()).decode()


_MADE: dict[str, Callable[[random.Random], str]] = {
    "jwt": secret_samples.MAKERS["jwt"],
    "private-key": secret_samples.MAKERS["private-key"],
    "private-key-base64": _pem_base64,
}


def _sample(rule: redactor.Rule, seed: str) -> tuple[str, tuple[int, int], str, int] | None:
    """A line holding a value of ``rule``'s form that its check accepts: the text, where the
    secret is, the keyword and where it stands; None after 60 tries."""
    rng = random.Random(seed)
    for _ in range(60):
        made = _MADE.get(rule.id) if rule.source == "sgme" else None
        value = made(rng) if made else secret_samples.from_pattern(rule.pattern, rng)
        # a rule that may match anywhere needs only one of its keywords somewhere in the text
        text = f"{rule.keywords[0]}: value {value}\n" if rule.anywhere else f"value {value}\n"
        m = rule.regex.search(text)
        if m is None:
            continue
        lowered = text.lower()
        for keyword in rule.keywords:
            at = lowered.find(keyword, 0 if rule.anywhere else m.start())
            if at < 0 or (at >= m.end() and not rule.anywhere):
                continue
            hit = rule.find_all(text, keyword) if rule.anywhere else rule.find(text, at, keyword)
            if hit:
                return text, rule._secret(m), keyword, at
    return None


@pytest.mark.parametrize("rule", redactor.FORMATS, ids=lambda r: f"{r.source}:{r.id}")
def test_a_value_of_each_format_is_found_whole(rule: redactor.Rule) -> None:
    found = _sample(rule, rule.id)
    assert found is not None, f"no value of {rule.id}'s form passes its own check"
    text, (start, end), _, _ = found
    covering = [f for f in redactor.scan(text) if f.start <= start and end <= f.end]
    assert covering, (text, redactor.scan(text))
    assert redactor.redact(text).text.count("[REDACTED:") >= 1


@pytest.mark.parametrize("rule", redactor.FORMATS, ids=lambda r: f"{r.source}:{r.id}")
def test_a_masked_value_of_each_format_is_not_a_secret(rule: redactor.Rule) -> None:
    found = _sample(rule, rule.id)
    assert found is not None
    text, (start, end), keyword, _ = found
    secret = text[start:end]
    prefix = len(keyword) if secret.lower().startswith(keyword) else 0
    masked = secret[:prefix] + "x" * (len(secret) - prefix)
    line = text[:start] + masked + text[end:]
    assert not [f for f in redactor.scan(line) if f.rule == rule.name], line


def test_the_table_is_sound() -> None:
    ids = [(r.source, r.id) for r in redactor.FORMATS]
    assert len(ids) == len(set(ids))
    assert len(redactor.FORMATS) > 200
    for rule in redactor.FORMATS:
        assert rule.keywords and all(k == k.lower() for k in rule.keywords), rule.id
        assert isinstance(rule.regex, re.Pattern)
        assert rule.kind == rule.kind.lower() and " " not in rule.kind
