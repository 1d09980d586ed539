"""A refiner that POSTs each window as JSON to an L1 service and stores the items it answers.

Options: ``url``, ``timeout`` seconds (default 30), ``headers`` (e.g. an Authorization header).
Request body: the window (``file_id``, ``agent_id``, ``session_key``, ``text``,
``source_refs``, ``messages``); answer: ``{"items": [{"kind", "content", "source_refs"}]}``,
or 204 / an empty body when the window holds nothing worth keeping.
"""

from __future__ import annotations

import httpx

from pipeline import errors, refine
from pipeline.refiners.openai import parse_items


class WebhookRefiner:
    """One POST per window."""

    name = "webhook"

    def __init__(
        self, *, url: str, timeout: float = 30.0, headers: dict[str, str] | None = None
    ) -> None:
        self.url = url
        self.client = httpx.Client(timeout=timeout, headers=headers or {})

    def refine(self, window: refine.Window) -> list[refine.Item]:
        """POST the window; the items of the answer."""
        try:
            response = self.client.post(self.url, json=window.to_json())
        except httpx.HTTPError as exc:
            raise errors.RefinerError(f"webhook request failed: {exc!r}") from None
        if response.status_code >= 300:
            raise errors.RefinerError(
                f"webhook answered {response.status_code}: {response.text[:200]}"
            )
        if response.status_code == 204 or not response.content.strip():
            return []  # nothing worth keeping in this window
        return parse_items(response.text)
