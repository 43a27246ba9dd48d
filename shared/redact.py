"""Secrets out of what people read: a URL's password masked before it is logged or shown.

Rule: pure string work; a string that does not parse as a URL is returned as it is (it holds
no password field to mask).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["mask_url"]


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
