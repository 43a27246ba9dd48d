"""`gavel api`'s flags (and `gavel up`'s), apart from the API server itself: the command line
is built for every verb, and a daemon's loads no HTTP API (`app` rule 1)."""

from __future__ import annotations

import argparse
import os

from gavel.cli.parsers import listen_port

__all__ = ["DEFAULT_PORT", "add_options"]

#: `app` rule 1.
DEFAULT_PORT = 8471


def add_options(p: argparse.ArgumentParser) -> None:
    """``--api-addr``, ``--api-port``, ``--api-token``, ``--api-read-token``,
    ``--api-operators``, ``--api-tls-cert``, ``--api-tls-key``."""
    p.add_argument("--api-addr", default="127.0.0.1", metavar="ADDR",
                   help="address the HTTP API listens on (default %(default)s; any other "
                   "needs a token)")
    p.add_argument("--api-port", type=listen_port, default=None, metavar="PORT",
                   help=f"port of the HTTP API (default {DEFAULT_PORT}, or a free one when "
                   "that is taken; 0: a free one)")
    p.add_argument("--api-token", default=os.environ.get("GAVEL_API_TOKEN", ""),
                   metavar="TOKEN", help="require this bearer token (env GAVEL_API_TOKEN; "
                   "default: none on loopback, a new one printed once on any other address)")
    p.add_argument("--api-read-token", default=os.environ.get("GAVEL_API_READ_TOKEN", ""),
                   metavar="TOKEN", help="also accept this bearer token, for the reading "
                   "routes only (env GAVEL_API_READ_TOKEN; a full token is then required "
                   "too, made at start if not given)")
    p.add_argument("--api-operators", default=os.environ.get("GAVEL_API_OPERATORS", ""),
                   metavar="DIR", help="also accept each named operator's own token, written "
                   "by `gavel auth operator add NAME --http-token` under this key directory "
                   "(STATE/auth), and ask as that operator (env GAVEL_API_OPERATORS)")
    p.add_argument("--api-tls-cert", default="", metavar="FILE",
                   help="serve HTTPS with this certificate (PEM; with --api-tls-key)")
    p.add_argument("--api-tls-key", default="", metavar="FILE",
                   help="the certificate's private key (PEM)")
