"""Who may read the dashboard.

Rules:
1. It listens on loopback unless told otherwise. On any other address it needs a token: the
   operator's (``--token``, GAVEL_UI_TOKEN) or one made at start and printed once, in the URL
   the command prints. A token given on loopback is required there too.
2. A request carries the token in the dashboard's cookie, an ``Authorization: Bearer`` header
   or a ``token`` query parameter (the printed URL: the page trades it for the cookie, so it
   leaves the address bar); any other request is refused 401. Tokens are compared in
   constant time.
3. Without a token, only a request whose Host names a loopback address or ``localhost`` is
   served: a page elsewhere cannot read the dashboard through a DNS name of its own that it
   points at 127.0.0.1 (DNS rebinding).
4. The cookie is named per port (cookies are per host, not per port): two dashboards on one
   machine keep a cookie each.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping
from http.cookies import CookieError, SimpleCookie

__all__ = ["LOOPBACK_NAMES", "authorized", "bearer_among", "cookie_name", "host_is_loopback",
           "is_loopback", "make_token", "token_for"]

#: Host names that mean this machine without asking DNS.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def is_loopback(addr: str) -> bool:
    """True for an address that only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    name = addr.strip("[]").lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def make_token() -> str:
    """A fresh token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


def token_for(addr: str, given: str) -> str:
    """Rule 1: the token a dashboard on `addr` requires ("" for none)."""
    if given:
        return given
    return "" if is_loopback(addr) else make_token()


def cookie_name(port: int) -> str:
    """Rule 4."""
    return f"gavel_ui_{port}"


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def authorized(token: str, port: int, headers: Mapping[str, str],
               query: Mapping[str, str]) -> bool:
    """Rule 2: whether a request with these (lower-cased) headers and query may be served."""
    if not token:
        return True
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and _same(value.strip(), token):
        return True
    if "token" in query and _same(query["token"], token):
        return True
    raw = headers.get("cookie", "")
    if raw:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:
            return False
        morsel = jar.get(cookie_name(port))
        if morsel is not None and _same(morsel.value, token):
            return True
    return False


def bearer_among(tokens: Iterable[str], headers: Mapping[str, str]) -> str:
    """The one of `tokens` the request's ``Authorization: Bearer`` header carries ("" for
    none), each compared in constant time."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return ""
    return next((t for t in tokens if t and _same(value.strip(), t)), "")


def host_is_loopback(host: str) -> bool:
    """Rule 3: whether a Host header (``name``, ``name:port``, ``[v6]:port``) names this
    machine."""
    host = host.strip()
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    else:
        name = host.rpartition(":")[0] if host.count(":") == 1 else host
    return bool(name) and is_loopback(name)
