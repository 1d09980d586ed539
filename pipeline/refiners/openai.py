"""A refiner for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, …).

Options: ``base_url`` (e.g. ``http://127.0.0.1:11434/v1``), ``model``, ``api_key`` (optional),
``timeout`` seconds (default 60), ``temperature`` (default 0), ``json_mode`` (send
``response_format: json_object``, default true). The model is asked for
``{"items": [{"kind", "content", "source_refs"}]}``; anything else is a retryable failure.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from pipeline import errors, refine

PROMPT = """You extract long-term memory items from a conversation transcript.
The transcript is in the L0 format: each message starts with a heading line
"# <time> <role>" or "## <time> <role>"; tool messages start with "**tool**: <name>".
Each message's source_ref is listed below the transcript.

Return JSON only, exactly: {"items": [{"kind": "...", "content": "...", "source_refs": ["..."]}]}
- kind: one of profile, preference, decision, fact, task, tool_result
- content: one self-contained sentence, in the conversation's language
- source_refs: the source_refs of the messages the item is based on (from the list only)
Return {"items": []} when nothing is worth keeping."""

_FENCED = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_items(text: str) -> list[refine.Item]:
    """Items from a model's answer; RefinerError when it is not the JSON asked for."""
    text = text.strip()
    fenced = _FENCED.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.RefinerError(f"refiner answer is not JSON: {exc}") from None
    raw_items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(raw_items, list):
        raise errors.RefinerError("refiner answer has no 'items' list")
    items = []
    for raw in raw_items:
        if not isinstance(raw, dict):
            continue
        kind, content, refs = raw.get("kind"), raw.get("content"), raw.get("source_refs")
        if isinstance(content, str) and isinstance(refs, list):
            items.append(
                refine.Item(
                    kind if isinstance(kind, str) else "fact",
                    content,
                    tuple(r for r in refs if isinstance(r, str)),
                )
            )
    return items


class OpenAIRefiner:
    """Chat-completions over HTTP with httpx."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        temperature: float = 0.0,
        json_mode: bool = True,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.temperature = temperature
        self.json_mode = json_mode
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers)

    def request_body(self, window: refine.Window) -> dict[str, Any]:
        """The chat-completions request for one window."""
        refs = "\n".join(f"- {ref}" for ref in window.source_refs)
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": self.temperature,
            "messages": [
                {"role": "system", "content": PROMPT},
                {"role": "user", "content": f"{window.text}\n---\nsource_refs:\n{refs}"},
            ],
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        return body

    def refine(self, window: refine.Window) -> list[refine.Item]:
        """Ask the model; validate its answer."""
        try:
            response = self.client.post(self.url, json=self.request_body(window))
        except httpx.HTTPError as exc:
            raise errors.RefinerError(f"chat-completions request failed: {exc!r}") from None
        if response.status_code != 200:
            raise errors.RefinerError(
                f"chat-completions answered {response.status_code}: {response.text[:200]}"
            )
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise errors.RefinerError(
                f"not a chat-completions answer: {response.text[:200]}"
            ) from None
        if not isinstance(content, str):
            raise errors.RefinerError("chat-completions answer has no text content")
        return parse_items(content)


__all__ = ["OpenAIRefiner", "parse_items"]
