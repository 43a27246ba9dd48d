"""Public suffixes: the names under which anyone may register a domain of their own, so a
route's wildcard directly under one (``*.com``, ``*.co.uk``) would claim every stranger's
name.

Rule: a wildcard host covers one label under a name with at least two labels that is not
on `PUBLIC`. The list is a small built-in one of the common suffixes (generic and country
top-level domains are caught by the two-label rule; the list adds the common second-level
registries and shared hosting suffixes), not the whole Public Suffix List: a wildcard under
a suffix it misses is still one label deep and still loses to every exact host.
"""

from __future__ import annotations

__all__ = ["PUBLIC", "too_wide"]

PUBLIC = frozenset({
    # second-level registries of common country codes
    "co.uk", "org.uk", "ac.uk", "gov.uk", "me.uk", "ltd.uk", "plc.uk", "net.uk",
    "com.au", "net.au", "org.au", "edu.au", "gov.au", "co.nz", "org.nz", "net.nz",
    "co.jp", "ne.jp", "or.jp", "ac.jp", "go.jp", "co.kr", "or.kr", "co.in", "net.in",
    "org.in", "com.br", "net.br", "org.br", "com.cn", "net.cn", "org.cn", "com.mx",
    "com.ar", "com.tr", "com.tw", "com.hk", "com.sg", "com.my", "co.za", "co.il",
    "com.pl", "com.ru", "com.ua", "co.id", "co.th", "com.vn", "com.ph", "com.co",
    # shared hosting and dynamic DNS, where each customer holds a name under the suffix
    "github.io", "gitlab.io", "herokuapp.com", "appspot.com", "azurewebsites.net",
    "cloudfront.net", "netlify.app", "vercel.app", "pages.dev", "workers.dev",
    "fly.dev", "web.app", "firebaseapp.com", "blogspot.com", "duckdns.org",
    "amazonaws.com", "elasticbeanstalk.com", "s3.amazonaws.com", "ngrok.io",
})


def too_wide(host: str) -> bool:
    """A wildcard host (``*.`` leading) directly under a public suffix, or under a single
    label (a top-level domain): the rule above."""
    if not host.startswith("*."):
        return False
    under = host[2:]
    return "." not in under or under in PUBLIC
