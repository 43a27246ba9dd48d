"""`gavel ui`'s flags (and `gavel up`'s ``--ui-...``), apart from the dashboard itself: the
command line is built for every verb, and a daemon's loads no dashboard (`app` rule 3)."""

from __future__ import annotations

import argparse
import os

from gavel.cli.parsers import listen_port

__all__ = ["DEFAULT_PORT", "add_options"]

#: `app` rule 3.
DEFAULT_PORT = 8470


def add_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--addr``, ``--port``, ``--token`` (each ``--ui-...`` with `prefix` "ui-")."""
    p.add_argument(f"--{prefix}addr", dest="ui_addr", default="127.0.0.1", metavar="ADDR",
                   help="address the dashboard listens on (default %(default)s; any other "
                   "needs a token)")
    p.add_argument(f"--{prefix}port", dest="ui_port", type=listen_port, default=None,
                   metavar="PORT", help=f"port of the dashboard (default {DEFAULT_PORT}, or a "
                   "free one when that is taken; 0: a free one)")
    p.add_argument(f"--{prefix}token", dest="ui_token",
                   default=os.environ.get("GAVEL_UI_TOKEN", ""), metavar="TOKEN",
                   help="require this token (env GAVEL_UI_TOKEN; default: none on loopback, "
                   "a new one printed once on any other address)")
