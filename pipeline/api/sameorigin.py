"""Cross-site browser requests: a web page the user visits can send a "simple" POST to a
loopback server with no preflight, so an endpoint that changes anything refuses a request a
browser marks as coming from another site."""

from __future__ import annotations

from collections.abc import Mapping


def cross_site(headers: Mapping[str, str], host: str) -> bool:
    """Whether a browser sent this request from another site: ``Sec-Fetch-Site:
    cross-site``, or an ``Origin`` (``null`` included) that is not ``http(s)://`` + the
    ``host`` the request was sent to. A request without either (curl, an SDK) is not."""
    if headers.get("sec-fetch-site", "").lower() == "cross-site":
        return True
    origin = headers.get("origin")
    if origin is None:
        return False
    scheme, _, rest = origin.partition("://")
    return scheme not in ("http", "https") or not rest or rest.lower() != host.lower()
