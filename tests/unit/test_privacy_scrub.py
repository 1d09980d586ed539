"""What an append becomes before it is journaled (pipeline.privacy): secrets replaced in
messages, in metadata keys and values, and in the idempotency key — the same way every time,
so that a retry is still the same request."""

from __future__ import annotations

import random

import secret_samples

from pipeline import privacy, redactor, validation

TOKEN = secret_samples.MAKERS["github-token"](random.Random(3))


def _append(**fields: object) -> validation.Append:
    body = {
        "agent_id": "hermes",
        "session_key": "s",
        "messages": [{"role": "user", "content": "hello"}],
        **fields,
    }
    return validation.parse_append(body, validation.DEFAULT_LIMITS)


def test_metadata_keys_are_scanned_like_values_and_a_named_value_is_an_assignment() -> None:
    append = _append(
        metadata={TOKEN: "x", "db_password": "Zk4rT8wQ1s", "nested": [{"apiKey": "k3yV4lu3G0L49"}]}
    )
    scrubbed, count = privacy.scrub_append(append)
    assert count == 3
    assert scrubbed.metadata == {
        "[REDACTED:github-token]": "x",
        "db_password": "[REDACTED:password]",
        "nested": [{"apiKey": "[REDACTED:api-key]"}],
    }
    assert scrubbed.digest == append.digest  # a retry of the request as sent still matches


def test_keys_that_redact_to_the_same_text_keep_every_value() -> None:
    other = secret_samples.MAKERS["github-token"](random.Random(4))
    scrubbed, count = privacy.scrub_append(_append(metadata={TOKEN: 1, other: 2}))
    assert count == 2
    assert scrubbed.metadata == {"[REDACTED:github-token]": 1, "[REDACTED:github-token] (2)": 2}


def test_an_idempotency_key_is_scrubbed_the_same_way_every_time() -> None:
    first, count = privacy.scrub_append(_append(idempotency_key=f"run-{TOKEN}"))
    again, _ = privacy.scrub_append(_append(idempotency_key=f"run-{TOKEN}"))
    assert count == 1 and first.idempotency_key == again.idempotency_key
    assert first.idempotency_key == "run-" + redactor.marker("github-token")


def test_a_scrubbed_key_is_cut_to_the_columns_width() -> None:
    # 199 characters; the marker is 5 longer than the key id it replaces
    key = "x" * 178 + " " + secret_samples.MAKERS["aws-access-key"](random.Random(1))
    scrubbed, count = privacy.scrub_key(key)
    assert count == 1 and scrubbed is not None
    assert len(scrubbed) == validation.MAX_IDEMPOTENCY_KEY
    assert privacy.scrub_key(None) == (None, 0)
    assert privacy.scrub_key("plain-key-1") == ("plain-key-1", 0)


def test_an_upload_has_its_text_metadata_keys_and_key_scrubbed() -> None:
    upload = validation.parse_upload(
        {
            "agent_id": "hermes",
            "content": f"token {TOKEN}",
            "filename": "notes.txt",
            "idempotency_key": f"up-{TOKEN}",
            "metadata": {"secret_token": "Zq8Wn3Vb6TyA"},
        },
        validation.DEFAULT_LIMITS,
    )
    scrubbed, count = privacy.scrub_upload(upload)
    assert count == 3
    assert scrubbed.content == "token " + redactor.marker("github-token")
    assert scrubbed.idempotency_key == "up-" + redactor.marker("github-token")
    assert scrubbed.metadata["secret_token"] == redactor.marker("token")
