"""Secrets out of what people read: a URL's password masked before it is logged or shown.

Rule: pure string work; a string that does not parse as a URL is returned as it is (it holds
no password field to mask). A comma list of URLs (a NATS cluster's) is masked URL by URL.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["mask_url"]


def mask_url(url: str) -> str:
    """The URL (or each of a comma list) with any password replaced by ***."""
    if "," in url:
        return ",".join(mask_url(part) for part in url.split(","))
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]  # as written: a port that is no number stays
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
